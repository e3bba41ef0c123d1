// kiln train end to end on the CPU: a few hundred steps on a small synthetic dataset must bring the
// loss well below its start and save a checkpoint that kiln loads and that scores the training data
// better than the original; the saved checkpoint keeps Hugging Face names, converts to
// --save-dtype and copies the tokenizer files; every kind of bad input fails with a clear message,
// a non-zero exit and no checkpoint written; stderr on a terminal shows a progress bar with ETA,
// elsewhere only the plain lines.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

std::string tiny_llama() { return testdata_dir() + "/tiny-llama"; }

// Sequences that follow simple rules (arithmetic progressions modulo the vocabulary), learnable by a
// two-layer model in a few hundred steps.
std::vector<std::vector<int32_t>> synthetic_sequences(int count, int length) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    const int start = 3 + (i * 37) % 300, stride = 1 + i % 3;
    std::vector<int32_t> seq;
    for (int t = 0; t < length; ++t) seq.push_back(3 + (start + stride * t) % 380);
    out.push_back(seq);
  }
  return out;
}

std::string ids_json(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

// The losses of the progress lines; every committed step advances the policy version by one.
std::vector<double> losses_of(const std::string& output) {
  std::vector<double> out;
  std::regex line(R"(step (\d+)/(\d+) policy_version (\d+) loss ([0-9.eE+-]+) grad_norm)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    EXPECT_EQ(std::stoll((*it)[3]), static_cast<long long>(out.size()) + 1) << (*it)[0];
    out.push_back(std::stod((*it)[4]));
  }
  return out;
}

// Mean negative log-likelihood of `ids` under the model in `dir`, from kiln score.
double mean_nll(const std::string& dir, const std::vector<int32_t>& ids) {
  std::string list;
  for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
  RunResult r = run_kiln("score --model " + dir + " --ids " + list);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.stdout_only);
  double sum = 0;
  int n = 0;
  for (const auto& lp : j["logprobs"]) {
    if (lp.is_null()) continue;
    sum -= lp.get<double>();
    ++n;
  }
  return sum / n;
}

void expect_clean_failure(const RunResult& r, const std::string& must_mention) {
  EXPECT_FALSE(r.crashed) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(must_mention), std::string::npos) << "expected the message to name '" << must_mention
                                                            << "': " << r.output;
}

TEST(CliTrain, LossFallsAndCheckpointLearned) {
  TempDir tmp;
  std::string data;
  const auto seqs = synthetic_sequences(24, 24);
  for (const auto& s : seqs) data += "{\"input_ids\": " + ids_json(s) + "}\n";
  const std::string jsonl = tmp.file("data.jsonl", data);
  RunResult r = run_kiln("train --model " + tiny_llama() + " --data " + jsonl + " --output " + tmp.sub("out") +
                         " --steps 300 --batch-size 4 --lr 3e-3 --betas 0.9,0.95 --weight-decay 0.01 --clip-norm 1.0"
                         " --shuffle --seed 7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> losses = losses_of(r.stdout_only);
  ASSERT_EQ(losses.size(), 300u) << r.output;
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) first += losses[i] / 10, last += losses[losses.size() - 1 - i] / 10;
  EXPECT_LT(last, 0.2 * first) << "loss over the first 10 steps " << first << ", last 10 " << last;

  // The checkpoint: Hugging Face names in the source dtype, loadable by kiln, and it fits the data.
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.sub("out") + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  Result<SafetensorsFile> src = SafetensorsFile::open(tiny_llama() + "/model.safetensors");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(f->names().size(), src->names().size());
  for (const std::string& n : src->names()) {
    Result<TensorInfo> t = f->find(n);
    ASSERT_TRUE(t.ok()) << n;
    EXPECT_EQ(t->dtype, DType::f32) << n;
    EXPECT_EQ(t->shape, src->find(n)->shape) << n;
  }
  const double before = mean_nll(tiny_llama(), seqs[5]), after = mean_nll(tmp.sub("out"), seqs[5]);
  EXPECT_LT(after, 0.2 * before) << "mean NLL of a training sequence: original " << before << ", trained " << after;
}

TEST(CliTrain, SaveDtypeAndCopiedFiles) {
  TempDir tmp;
  // A model folder with a tokenizer beside the weights.
  fs::create_directories(tmp.sub("model"));
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(tiny_llama()) / f, fs::path(tmp.sub("model")) / f);
  fs::copy_file(fs::path(testdata_dir()) / "tokenizers/bytelevel-bpe.tokenizer.json",
                fs::path(tmp.sub("model")) / "tokenizer.json");
  const std::string jsonl = tmp.file("data.jsonl", "{\"input_ids\": [5, 6, 7, 8], \"labels\": [-100, 6, 7, 8]}\n");
  // SGD with lr 0: the saved weights are the source's, rounded to bf16.
  RunResult r = run_kiln("train --model " + tmp.sub("model") + " --data " + jsonl + " --output " + tmp.sub("out") +
                         " --optimizer sgd --lr 0 --save-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Result<SafetensorsFile> f = SafetensorsFile::open(tmp.sub("out") + "/model.safetensors");
  Result<SafetensorsFile> src = SafetensorsFile::open(tiny_llama() + "/model.safetensors");
  ASSERT_TRUE(f.ok() && src.ok());
  for (const std::string& n : src->names()) {
    TensorInfo a = *src->find(n), b = *f->find(n);
    ASSERT_EQ(b.dtype, DType::bf16) << n;
    const float* x = static_cast<const float*>(a.data);
    const uint16_t* y = static_cast<const uint16_t*>(b.data);
    for (int64_t i = 0; i < a.shape.numel(); ++i) ASSERT_EQ(y[i], f32_to_bf16(x[i])) << n << "[" << i << "]";
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tmp.sub("out") + "/config.json"));
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  EXPECT_TRUE(fs::exists(tmp.sub("out") + "/tokenizer.json"));
  // kiln loads what it wrote.
  RunResult g = run_kiln("generate --model " + tmp.sub("out") + " --prompt-ids 5,6,7 --max-tokens 3");
  EXPECT_EQ(g.exit_code, 0) << g.output;
}

TEST(CliTrain, BadInputFailsCleanly) {
  TempDir tmp;
  const std::string model = " --model " + tiny_llama();
  const std::string out = " --output " + tmp.sub("out");
  auto train = [&](const std::string& jsonl_text, const std::string& extra = "") {
    return run_kiln("train" + model + " --data " + tmp.file("d.jsonl", jsonl_text) + out + extra);
  };
  const std::string good = "{\"input_ids\": [5, 6, 7]}\n";
  expect_clean_failure(train(good + good + "{\"input_ids\": [5, 6,\n"), "d.jsonl:3");
  expect_clean_failure(train(good + "[1, 2, 3]\n"), "d.jsonl:2");
  expect_clean_failure(train("{\"labels\": [1, 2]}\n"), "input_ids");
  expect_clean_failure(train("{\"input_ids\": [5, \"x\"]}\n"), "d.jsonl:1");
  // A value nested 100,000 levels deep is described, not printed (printing it recursed to a crash).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_clean_failure(train("{\"input_ids\": [5, " + deep + "]}\n"), "nested 100000 levels deep");
  expect_clean_failure(train("{\"input_ids\": [5, 6, 384]}\n"), "vocabulary");
  expect_clean_failure(train("{\"input_ids\": [5, 6, 7], \"labels\": [5, 6, 999]}\n"), "labels[2]");
  expect_clean_failure(train("{\"input_ids\": [5, 6, 7], \"labels\": [5, 6]}\n"), "labels");
  std::vector<int32_t> too_long(257, 5);
  expect_clean_failure(train("{\"input_ids\": " + ids_json(too_long) + "}\n"), "max_position_embeddings");
  expect_clean_failure(train("{\"input_ids\": [5, 6, 7], \"position_ids\": [0, 1]}\n"), "position_ids");
  expect_clean_failure(train(""), "no examples");
  expect_clean_failure(train(good, " --optimizer adam"), "--optimizer");
  expect_clean_failure(train(good, " --betas 0.9"), "--betas");
  expect_clean_failure(train(good, " --no-decay q_proj"), "q_proj");
  expect_clean_failure(train(good, " --no-decay '('"), "--no-decay");
  for (const char* flag : {"--lr", "--eps", "--weight-decay", "--clip-norm"})
    for (const char* v : {"nan", "inf", "-1"}) expect_clean_failure(train(good, std::string(" ") + flag + " " + v), flag);
  expect_clean_failure(train(good, " --betas nan,0.9"), "--betas");
  expect_clean_failure(train(good, " --lr-schedule exponential"), "--lr-schedule");
  expect_clean_failure(train(good, " --lr-schedule wsd"), "--decay-steps");
  expect_clean_failure(train(good, " --lr-schedule cosine --min-lr-ratio 2"), "--min-lr-ratio");
  expect_clean_failure(train(good, " --warmup-steps -3"), "--warmup-steps");
  for (const char* v : {"-1", "18446744073709551616"}) expect_clean_failure(train(good, std::string(" --seed ") + v), "--seed");
  // Micro-batches too large to index or to hold: errors naming --batch-size before anything is built
  // (100M rows of 199 tokens overflow int32 token indexes; 10M rows need 56 GB of host copies, or,
  // on a machine that holds them, 510 GB of f32 activations: an out-of-memory status of the step).
  const std::string long_row = "{\"input_ids\": " + ids_json(std::vector<int32_t>(199, 5)) + "}\n";
  expect_clean_failure(train(long_row, " --steps 1 --batch-size 100000000"), "--batch-size");
  expect_clean_failure(train(long_row, " --steps 1 --batch-size 10000000"), "--batch-size");
  // A step's micro-batches are held together: 2^31 - 1 of one row need about 7 TB (the process was
  // killed by the OOM killer before this was checked).
  expect_clean_failure(train(long_row, " --steps 1 --grad-accum 2147483647"), "--grad-accum");
  expect_clean_failure(run_kiln("train" + model + " --data " + tmp.sub("missing.jsonl") + out), "missing.jsonl");
  // An output path under a regular file cannot be created.
  const std::string blocker = tmp.file("blocker", "x");
  expect_clean_failure(run_kiln("train" + model + " --data " + tmp.file("d.jsonl", good) + " --output " + blocker + "/out"),
                       "output directory");
  EXPECT_FALSE(fs::exists(tmp.sub("out") + "/model.safetensors"));
}

// transformers' get_cosine_schedule_with_warmup for lr 0.01, 2 warmup steps, 6 steps, written out:
// the lr of the step that starts from policy version v.
double cosine_lr(int v) { return v < 2 ? 0.01 * v / 2.0 : 0.01 * 0.5 * (1.0 + std::cos(M_PI * (v - 2) / 4.0)); }

// The learning rate of each progress line is the schedule's at the step's policy version.
TEST(CliTrain, ScheduledLearningRate) {
  TempDir tmp;
  std::string data;
  for (const auto& s : synthetic_sequences(6, 12)) data += "{\"input_ids\": " + ids_json(s) + "}\n";
  RunResult r = run_kiln("train --model " + tiny_llama() + " --data " + tmp.file("d.jsonl", data) + " --output " +
                         tmp.sub("out") + " --lr 0.01 --lr-schedule cosine --warmup-steps 2 --steps 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex line(R"(step (\d+)/6 policy_version (\d+) loss \S+ grad_norm \S+ lr (\S+) )");
  int n = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it, ++n) {
    const int v = std::stoi((*it)[1]) - 1;  // the version the step started from
    EXPECT_NEAR(std::stod((*it)[3]), cosine_lr(v), 1e-5 * 0.01 + 1e-12) << (*it)[0];
  }
  EXPECT_EQ(n, 6) << r.output;
  // metrics.jsonl: one object per step with the progress line's figures.
  std::ifstream metrics(tmp.sub("out") + "/metrics.jsonl");
  std::string row;
  int rows = 0;
  while (std::getline(metrics, row)) {
    nlohmann::json j = nlohmann::json::parse(row);
    ++rows;
    EXPECT_EQ(j["step"], rows);
    EXPECT_EQ(j["policy_version"], rows);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens", "tokens_per_s"}) EXPECT_TRUE(j[key].is_number()) << row;
    EXPECT_NEAR(j["lr"].get<double>(), cosine_lr(rows - 1), 1e-9) << row;
  }
  EXPECT_EQ(rows, 6);
}

// --config run.toml: every flag as a key (dashes or underscores), the command line overriding it;
// keys that are not flags, tables (but for *_kwargs) and syntax errors name the file.
TEST(CliTrain, ConfigFile) {
  TempDir tmp;
  std::string data;
  for (const auto& s : synthetic_sequences(4, 12)) data += "{\"input_ids\": " + ids_json(s) + "}\n";
  const std::string base = "train --model " + tiny_llama() + " --data " + tmp.file("d.jsonl", data) + " --output " + tmp.sub("out");
  const std::string cfg = tmp.file("run.toml", "lr = 0.02\nlr_schedule = \"linear\"\nwarmup-steps = 0\nsteps = 4\nshuffle = true\n");
  RunResult r = run_kiln(base + " --config " + cfg + " --steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2/2 "), std::string::npos) << r.output;  // --steps 2 beat the file's 4
  EXPECT_EQ(r.output.find("step 3/"), std::string::npos) << r.output;
  // linear over 2 steps from 0.02: 0.02 then 0.01 (the file's lr and schedule took effect)
  EXPECT_NE(r.output.find(" lr 0.02 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" lr 0.01 "), std::string::npos) << r.output;
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("a.toml", "learning_rate = 3\n")),
                       "'learning_rate' is not a flag of kiln train");
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("b.toml", "lr = = 1\n")), "line 1");
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("c.toml", "[optim]\nlr = 1\n")), "optim.lr' is not a flag of kiln train");
  expect_clean_failure(run_kiln(base + " --config " + tmp.sub("missing.toml")), "missing.toml");
  // A table is the JSON object of a *_kwargs flag: it reaches the objective, which checks its keys.
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("d.toml", "[objective_kwargs]\nbeta = 0.1\n")),
                       "the pretrain objective has no option 'beta'");
  expect_clean_failure(run_kiln(base + " --objective-kwargs '[1]'"), "must be a JSON object");
}

TEST(CliTrain, NonFiniteStopsWithoutCheckpoint) {
  TempDir tmp;
  std::string data;
  for (const auto& s : synthetic_sequences(4, 16)) data += "{\"input_ids\": " + ids_json(s) + "}\n";
  // A learning rate of 1e30 sends the weights to infinity after the first step.
  RunResult r = run_kiln("train --model " + tiny_llama() + " --data " + tmp.file("d.jsonl", data) + " --output " +
                         tmp.sub("out") + " --optimizer sgd --lr 1e30 --steps 5");
  expect_clean_failure(r, "not finite");
  EXPECT_NE(r.output.find("step 2"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.sub("out") + "/model.safetensors"));
}

// Runs `kiln <args>` with stderr on a pseudo-terminal, stdout into `stdout_file` and stdin from
// /dev/null; returns everything the terminal received (its line discipline turns "\n" into "\r\n")
// and sets *exit_code (-1 when kiln did not exit normally).
std::string run_kiln_on_terminal(const std::string& args, const std::string& stdout_file, int* exit_code) {
  *exit_code = -1;
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return "";
  }
  const std::string cmd = "exec " + kiln_binary() + " " + args + " >" + stdout_file + " </dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(slave, STDERR_FILENO);
    ::close(slave);
    ::close(master);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(slave);
  std::string terminal;
  char buf[4096];
  for (;;) {  // until the last holder of the terminal's other side (kiln) is gone: EIO
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) break;
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    terminal.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) *exit_code = WEXITSTATUS(status);
  return terminal;
}

// On a terminal, stderr carries a bar redrawn in place after every step ("\r\033[K" then
// "train [###.....] 2.0/6.0 steps  33% ETA 1s loss 5.1234"), erased before other messages; the step
// lines still go to stdout. Without a terminal, stderr has no bar, no ETA and no control characters.
TEST(CliTrain, ProgressBarWithEtaOnATerminalPlainLinesOtherwise) {
  TempDir tmp;
  std::string data;
  for (const auto& s : synthetic_sequences(6, 12)) data += "{\"input_ids\": " + ids_json(s) + "}\n";
  const std::string args = "train --model " + tiny_llama() + " --data " + tmp.file("d.jsonl", data) + " --steps 6 --output ";
  constexpr int kSteps = 6, kWidth = 28;

  int exit_code = -1;
  const std::string terminal = run_kiln_on_terminal(args + tmp.sub("tty"), tmp.sub("tty.out"), &exit_code);
  ASSERT_EQ(exit_code, 0) << terminal;
  std::vector<double> losses;
  std::ifstream metrics(tmp.sub("tty") + "/metrics.jsonl");
  for (std::string row; std::getline(metrics, row);) losses.push_back(nlohmann::json::parse(row).at("loss").get<double>());
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  std::ifstream out_file(tmp.sub("tty.out"));
  const std::string out((std::istreambuf_iterator<char>(out_file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(losses_of(out).size(), static_cast<size_t>(kSteps)) << "the step lines on stdout:\n" << out;

  std::regex bar(R"(\r\x1b\[Ktrain \[([#.]+)\] (\d+\.\d)/(\d+\.\d) steps +(\d+)% ETA (\S+) loss (\S+))");
  std::vector<std::smatch> bars;
  for (std::sregex_iterator it(terminal.begin(), terminal.end(), bar), end; it != end; ++it) bars.push_back(*it);
  ASSERT_EQ(bars.size(), static_cast<size_t>(kSteps)) << "one redraw per step expected; the terminal got:\n" << terminal;
  for (int done = 1; done <= kSteps; ++done) {
    const std::smatch& m = bars[static_cast<size_t>(done - 1)];
    const std::string shown = m.str().substr(4);  // without "\r\033[K"
    char want[32];
    std::snprintf(want, sizeof want, "%d.0", done);
    EXPECT_EQ(m[2].str(), want) << shown;
    EXPECT_EQ(m[3].str(), std::to_string(kSteps) + ".0") << shown;
    const int filled = done * kWidth / kSteps;
    EXPECT_EQ(m[1].str(), std::string(filled, '#') + std::string(kWidth - filled, '.')) << shown;
    EXPECT_EQ(std::stoi(m[4]), static_cast<int>(std::lround(100.0 * done / kSteps))) << shown;
    // The time left: a duration once a step has set the rate ("?" before), none after the last step.
    EXPECT_TRUE(std::regex_match(m[5].str(), std::regex(R"(\d+s|\d+m\d\ds|\d+h\d\dm)"))) << shown;
    if (done == kSteps) {
      EXPECT_EQ(m[5].str(), "0s") << shown;
    }
    std::snprintf(want, sizeof want, "%.4f", losses[static_cast<size_t>(done - 1)]);
    EXPECT_EQ(m[6].str(), want) << shown;
  }
  // The bar is erased before the closing message, which therefore starts its own clean line.
  EXPECT_NE(terminal.find("\r\x1b[Kkiln: saved the trained model"), std::string::npos) << terminal;

  // The same run with stderr in a file: only plain lines, the step lines on stdout.
  RunResult plain = run_kiln(args + tmp.sub("plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(losses_of(plain.stdout_only).size(), static_cast<size_t>(kSteps)) << plain.stdout_only;
  const std::string err = plain.output.substr(plain.stdout_only.size());
  EXPECT_NE(err.find("kiln: saved the trained model"), std::string::npos) << err;
  EXPECT_EQ(err.find("ETA"), std::string::npos) << err;
  EXPECT_EQ(err.find("train ["), std::string::npos) << err;
  EXPECT_EQ(err.find_first_of("\r\x1b"), std::string::npos) << err;
}

}  // namespace
}  // namespace kiln::test
