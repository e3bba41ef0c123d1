// The RL rewards (rl/reward.h): the answer kind's number extraction and comparison, regex, the
// penalties, option checks, and the external kinds against real processes (sh/awk programs: their
// output, their failures, a time limit, a batch far beyond the pipes' buffers) and a real HTTP
// server (a socket in a thread of the test answering one request).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rl/reward.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using rl::RewardOptions;
using rl::RewardResult;
using rl::Rollout;

Rollout rollout(const std::string& text, nlohmann::json fields = nlohmann::json::object(), int64_t group = 0,
                size_t tokens = 0) {
  Rollout r;
  r.prompt_ids = {1, 2, 3};
  r.completion_ids.assign(tokens ? tokens : (text.size() + 3) / 4, 7);
  r.token_versions.assign(r.completion_ids.size(), 0);
  r.logprobs.assign(r.completion_ids.size(), -0.5f);
  r.group = group;
  r.finish_reason = "stop";
  r.text = text;
  r.has_text = true;
  r.fields = std::move(fields);
  return r;
}

std::unique_ptr<rl::Reward> make(const RewardOptions& o) {
  auto r = rl::make_reward(o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

RewardOptions kind(const std::string& k) {
  RewardOptions o;
  o.kind = k;
  return o;
}

// The error make_reward gives for `o` ("" when it succeeds).
std::string make_error(const RewardOptions& o) {
  auto r = rl::make_reward(o);
  return r.ok() ? "" : r.status().message();
}

// The error of scoring `rollouts` ("" when it succeeds).
std::string score_error(rl::Reward& reward, const std::vector<Rollout>& rollouts) {
  auto r = reward.score(rollouts);
  return r.ok() ? "" : r.status().message();
}

std::vector<double> rewards_of(const std::vector<RewardResult>& results) {
  std::vector<double> v;
  for (const RewardResult& r : results) v.push_back(r.reward);
  return v;
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---------------------------------------------------------------- answer

TEST(RewardAnswer, ExtractsTheLastBoxedOrTheLastNumber) {
  auto x = [](const std::string& s) { return rl::extract_answer(s).value_or("<none>"); };
  EXPECT_EQ(x("The answer is \\boxed{42}."), "42");
  EXPECT_EQ(x("first \\boxed{1} then \\boxed{2}, and 3 more"), "2");
  EXPECT_EQ(x("\\boxed{x = 12} though 13 is close"), "12");
  EXPECT_EQ(x("\\boxed {8}"), "8");
  EXPECT_EQ(x("\\boxed{\\boxed{5}}"), "5");
  EXPECT_EQ(x("\\boxed{\\$1,234}"), "1234");
  EXPECT_EQ(x("\\boxed{-7}"), "-7");
  EXPECT_EQ(x("\\boxed{A}, or 4"), "<none>");  // the model committed to a non-number
  EXPECT_EQ(x("\\boxed{5 and then 6"), "6");   // unclosed: the last number of the text
  EXPECT_EQ(x("so 3 + 4 = 7."), "7");
  EXPECT_EQ(x("It is -5 degrees"), "-5");
  EXPECT_EQ(x("x = \xE2\x88\x92" "3"), "-3");  // U+2212 MINUS SIGN
  EXPECT_EQ(x("(-2)"), "-2");
  EXPECT_EQ(x("from 5-3"), "3");  // a difference, not a negative number
  EXPECT_EQ(x("pi is 3.14."), "3.14");
  EXPECT_EQ(x("costs $1,234,567.89 in total"), "1234567.89");
  EXPECT_EQ(x("1,23"), "23");  // not a thousands group
  EXPECT_EQ(x("12345,678"), "678");
  EXPECT_EQ(x("007"), "7");
  EXPECT_EQ(x("-0"), "0");
  EXPECT_EQ(x("no digits here"), "<none>");
  EXPECT_EQ(x(""), "<none>");
}

TEST(RewardAnswer, ComparesNumbersExactlyOrRelatively) {
  EXPECT_TRUE(rl::same_number("42", "42"));
  EXPECT_TRUE(rl::same_number("42", "42.0"));
  EXPECT_TRUE(rl::same_number("2.5", "2.50"));
  EXPECT_TRUE(rl::same_number("1.0000001", "1"));
  EXPECT_TRUE(rl::same_number("1e+20", "100000000000000000000"));
  EXPECT_FALSE(rl::same_number("1.00001", "1"));
  EXPECT_FALSE(rl::same_number("-3", "3"));
  EXPECT_FALSE(rl::same_number("12345678901234567890", "12345678901234567891"));  // exact beyond doubles
  EXPECT_FALSE(rl::same_number("0", "0.000001"));
}

TEST(RewardAnswer, ScoresAgainstTheAnswerField) {
  auto reward = make(kind("answer"));
  ASSERT_TRUE(reward);
  const std::vector<Rollout> rs = {
      rollout("so \\boxed{42}", {{"answer", 42}}),
      rollout("the total is 1,234.", {{"answer", "Step 1: <<1000+234=1234>>\n#### 1,234"}}),  // GSM8K
      rollout("half: 2.5", {{"answer", 2.5}}),
      rollout("\\boxed{-3}", {{"answer", "\\boxed{-3}"}}),
      rollout("I think 41", {{"answer", 42}}),
      rollout("", {{"answer", 1}}, 0, /*tokens=*/0),  // an empty completion has no answer
      rollout("\\boxed{12345678901234567890}", {{"answer", 12345678901234567890ull}}),
  };
  auto res = reward->score(rs);
  ASSERT_TRUE(res.ok()) << res.status().message();
  ASSERT_EQ(res->size(), rs.size());
  EXPECT_EQ(rewards_of(*res), (std::vector<double>{1, 1, 1, 1, 0, 0, 1}));
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_TRUE((*res)[i].correct.has_value());
    EXPECT_EQ(*(*res)[i].correct, (*res)[i].reward == 1.0);
  }
  EXPECT_HAS(reward->describe(), "fields.answer");
}

TEST(RewardAnswer, ErrorsNameTheSample) {
  auto reward = make(kind("answer"));
  ASSERT_TRUE(reward);
  const Rollout good = rollout("4", {{"answer", 4}});
  std::string e = score_error(*reward, {good, rollout("4", {{"solution", 4}}, 7)});
  EXPECT_HAS(e, "sample 1 (group 7)");
  EXPECT_HAS(e, "no field 'answer'");
  e = score_error(*reward, {rollout("4", {{"answer", "unknown"}}, 3)});
  EXPECT_HAS(e, "sample 0 (group 3)");
  EXPECT_HAS(e, "has no number");
  e = score_error(*reward, {rollout("4", {{"answer", true}})});
  EXPECT_HAS(e, "boolean");
  Rollout untokenized = rollout("", {{"answer", 4}}, 2, /*tokens=*/5);
  untokenized.has_text = false;
  e = score_error(*reward, {good, good, untokenized});
  EXPECT_HAS(e, "sample 2 (group 2)");
  EXPECT_HAS(e, "needs a tokenizer");

  RewardOptions o = kind("answer");
  o.answer_field = "target";
  auto custom = make(o);
  ASSERT_TRUE(custom);
  auto res = custom->score({rollout("\\boxed{9}", {{"target", "9"}})});
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ((*res)[0].reward, 1.0);
}

// ---------------------------------------------------------------- regex and penalties

TEST(RewardRegex, MatchesAnywhereInTheText) {
  RewardOptions o = kind("regex");
  o.pattern = "<answer>\\s*\\d+\\s*</answer>";
  auto reward = make(o);
  ASSERT_TRUE(reward);
  auto res = reward->score({rollout("think... <answer> 12 </answer> done"), rollout("<answer>twelve</answer>"),
                            rollout("bytes \xFF\xFE then <answer>3</answer>")});
  ASSERT_TRUE(res.ok()) << res.status().message();
  EXPECT_EQ(rewards_of(*res), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ((*res)[1].correct, std::optional<bool>(false));

  // A long completion does not exhaust a recursion or stack limit (std::regex would crash here).
  RewardOptions star = kind("regex");
  star.pattern = "^(a|b)*x";
  auto reward2 = make(star);
  ASSERT_TRUE(reward2);
  auto res2 = reward2->score({rollout(std::string(300000, 'a') + "x"), rollout(std::string(300000, 'a'))});
  ASSERT_TRUE(res2.ok()) << res2.status().message();
  EXPECT_EQ(rewards_of(*res2), (std::vector<double>{1, 0}));

  // Catastrophic backtracking hits PCRE2's match limit: an error naming the sample, not a 0.
  RewardOptions redos = kind("regex");
  redos.pattern = "^(\\w+\\s?)*$";
  auto reward3 = make(redos);
  ASSERT_TRUE(reward3);
  const std::string e = score_error(*reward3, {rollout("fine"), rollout(std::string(5000, 'a') + "!", {}, 6)});
  EXPECT_HAS(e, "sample 1 (group 6)");
  EXPECT_HAS(e, "could not be matched");

  o.pattern = "(unclosed";
  EXPECT_HAS(make_error(o), "reward.pattern");
  o.pattern = "";
  EXPECT_HAS(make_error(o), "needs reward.pattern");
}

TEST(RewardPenalties, SubtractFromAnyKind) {
  RewardOptions o = kind("answer");
  o.length_penalty = 0.01;
  o.length_target = 10;
  o.format_penalty = 0.5;
  o.format_pattern = "^<think>";
  o.truncation_penalty = 0.25;
  auto reward = make(o);
  ASSERT_TRUE(reward);
  Rollout truncated = rollout("<think>long</think> 7", {{"answer", 7}}, 0, 10);
  truncated.finish_reason = "length";
  const std::vector<Rollout> rs = {
      rollout("<think>ok</think> 7", {{"answer", 7}}, 0, 10),   // nothing to subtract
      rollout("<think>ok</think> 7", {{"answer", 7}}, 0, 15),   // 5 tokens over
      rollout("7", {{"answer", 7}}, 0, 4),                      // no <think>
      rollout("<think>ok</think> 8", {{"answer", 7}}, 0, 12),   // wrong and 2 over
      truncated,
  };
  auto res = reward->score(rs);
  ASSERT_TRUE(res.ok()) << res.status().message();
  const std::vector<double> want = {1.0, 1.0 - 0.05, 0.5, -0.02, 0.75};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*res)[i].reward, want[i], 1e-12) << i;
  EXPECT_EQ((*res)[2].correct, std::optional<bool>(true));  // penalties leave correctness alone
  EXPECT_EQ((*res)[3].correct, std::optional<bool>(false));
  const std::string d = reward->describe();
  EXPECT_HAS(d, "length penalty 0.01 per token beyond 10");
  EXPECT_HAS(d, "format penalty 0.5");
  EXPECT_HAS(d, "truncation penalty 0.25");

  // The format check needs text, checked before the inner reward runs.
  Rollout untokenized = rollout("", {{"answer", 7}}, 4, 3);
  untokenized.has_text = false;
  std::string e = score_error(*reward, {untokenized});
  EXPECT_HAS(e, "sample 0 (group 4)");
  EXPECT_HAS(e, "needs a tokenizer");
}

TEST(RewardConfig, InvalidOptionsAreErrorsNamingThem) {
  EXPECT_HAS(make_error(kind("")), "reward.kind is not set");
  EXPECT_HAS(make_error(kind("exact")), "reward.kind \"exact\" is unknown");
  RewardOptions o = kind("answer");
  o.pattern = "x";
  EXPECT_HAS(make_error(o), "reward.pattern is only read by reward.kind = \"regex\"");
  o = kind("regex");
  o.pattern = "x";
  o.answer_field = "target";
  EXPECT_HAS(make_error(o), "reward.answer_field");
  o = kind("answer");
  o.length_penalty = -1;
  EXPECT_HAS(make_error(o), "reward.length_penalty");
  o = kind("answer");
  o.format_penalty = 1;
  EXPECT_HAS(make_error(o), "without reward.format_pattern");
  o = kind("answer");
  o.format_pattern = "x";
  EXPECT_HAS(make_error(o), "reward.format_penalty is 0");
  o = kind("answer");
  o.length_target = 100;
  EXPECT_HAS(make_error(o), "reward.length_penalty is 0");
  o = kind("answer");
  o.format_penalty = 1;
  o.format_pattern = "[";
  EXPECT_HAS(make_error(o), "reward.format_pattern");
  o = kind("command");
  EXPECT_HAS(make_error(o), "needs reward.command");
  o.command = "true";
  o.timeout_s = 0;
  EXPECT_HAS(make_error(o), "reward.timeout_s");
  o = kind("url");
  o.url = "https://example.com/score";
  EXPECT_HAS(make_error(o), "use http:// or a local proxy");
  o.url = "ftp://example.com";
  EXPECT_HAS(make_error(o), "not an http:// URL");
  o.url = "http://localhost:99999/";
  EXPECT_HAS(make_error(o), "1..65535");
}

// ---------------------------------------------------------------- command

std::vector<Rollout> batch(size_t n, size_t text_len = 20) {
  std::vector<Rollout> rs;
  for (size_t i = 0; i < n; ++i) {
    std::string text(text_len, static_cast<char>('a' + i % 26));
    nlohmann::json fields = nlohmann::json::object();
    fields["answer"] = static_cast<int64_t>(i);
    rs.push_back(rollout(text, std::move(fields), static_cast<int64_t>(i / 4), 1 + i % 7));
  }
  return rs;
}

RewardOptions command(const std::string& cmd, double timeout_s = 60) {
  RewardOptions o = kind("command");
  o.command = cmd;
  o.timeout_s = timeout_s;
  return o;
}

TEST(RewardCommand, ReadsOneNumberPerRollout) {
  TempDir dir;
  // Half the completion's token count, from the JSON record (awk: no python needed).
  const std::string script = dir.file("reward.sh",
                                      "awk '{ s = $0; if (match(s, /\"completion_ids\":\\[[^]]*\\]/)) {"
                                      " s = substr(s, RSTART + 18, RLENGTH - 19);"
                                      " n = (s == \"\") ? 0 : gsub(/,/, \",\", s) + 1; print n * 0.5 } else print \"none\" }'\n");
  RewardOptions o = command("sh " + script);
  o.truncation_penalty = 1;
  auto reward = make(o);
  ASSERT_TRUE(reward);
  std::vector<Rollout> rs = batch(9);
  rs[3].finish_reason = "length";
  auto res = reward->score(rs);
  ASSERT_TRUE(res.ok()) << res.status().message();
  ASSERT_EQ(res->size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_DOUBLE_EQ((*res)[i].reward, 0.5 * static_cast<double>(rs[i].completion_ids.size()) - (i == 3 ? 1 : 0)) << i;
    EXPECT_FALSE((*res)[i].correct.has_value());
  }
  EXPECT_HAS(reward->describe(), "command `sh ");

  // The records it reads carry no reward or advantage; JSON number forms and spaces are accepted.
  auto plain = make(command("awk '{ r = (index($0, \"\\\"reward\\\"\") || index($0, \"\\\"advantage\\\"\")) ? \"1\" : \" -0.5e1 \"; print r }'"));
  ASSERT_TRUE(plain);
  auto res2 = plain->score(batch(3));
  ASSERT_TRUE(res2.ok()) << res2.status().message();
  EXPECT_EQ(rewards_of(*res2), (std::vector<double>{-5, -5, -5}));
  // An empty batch runs nothing.
  auto none = plain->score({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(RewardCommand, BadOutputIsAnErrorNamingTheLine) {
  const std::vector<Rollout> rs = batch(3);
  auto run = [&](const std::string& cmd) {
    auto reward = make(command(cmd));
    return reward ? score_error(*reward, rs) : "make_reward failed";
  };
  std::string e = run("cat >/dev/null; echo 1; echo abc; echo 3");
  EXPECT_HAS(e, "line 2");
  EXPECT_HAS(e, "sample 1 (group 0)");
  EXPECT_HAS(e, "'abc'");
  e = run("cat >/dev/null; echo 1; echo 1e999; echo 3");
  EXPECT_HAS(e, "line 2");
  EXPECT_HAS(e, "not a finite number");
  e = run("cat >/dev/null; echo nan; echo 1; echo 1");
  EXPECT_HAS(e, "line 1");
  e = run("cat >/dev/null; echo 01; echo 1; echo 1");  // not JSON number syntax
  EXPECT_HAS(e, "line 1");
  e = run("cat >/dev/null; printf '%0300d\\n' 0 | tr 0 x; echo 1; echo 1");
  EXPECT_HAS(e, "(300 bytes)");  // the quote is cut
  e = run("cat >/dev/null; echo 1");
  EXPECT_HAS(e, "printed 1 line for 3 rollouts");
  EXPECT_HAS(e, "sample 1 (group 0)");
  e = run("cat >/dev/null; echo 1; echo 2; echo 3; echo 4");
  EXPECT_HAS(e, "printed 4 lines for 3 rollouts");
  e = run("cat >/dev/null; echo 'it went wrong' >&2; exit 1");
  EXPECT_HAS(e, "exited with status 1");
  EXPECT_HAS(e, "it went wrong");
  e = run("kill -9 $$");
  EXPECT_HAS(e, "killed by signal 9");
  e = run("/nonexistent/program");
  EXPECT_HAS(e, "exited with status 127");
  EXPECT_HAS(e, "not found");
}

TEST(RewardCommand, TimeoutKillsTheProcessGroup) {
  auto reward = make(command("sleep 30 & sleep 30", 1));
  ASSERT_TRUE(reward);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = score_error(*reward, batch(2));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_HAS(e, "timed out after 1 s");
  EXPECT_LT(took, 10.0);  // the background sleep holds the pipes too: it went with its group
}

TEST(RewardCommand, LargeBatchDoesNotDeadlock) {
  // 5000 records of ~2 KB (10 MB in), a 200-digit number per line out (1 MB) and every record echoed
  // on stderr (10 MB): each pipe fills many times over while the others are busy.
  const std::vector<Rollout> rs = batch(5000, 2000);
  auto reward = make(command(
      "awk 'BEGIN { z = sprintf(\"%0200d\", 0) } { printf \"%d.%s\\n\", length($0), z; print $0 > \"/dev/stderr\" }'"));
  ASSERT_TRUE(reward);
  auto res = reward->score(rs);
  ASSERT_TRUE(res.ok()) << res.status().message();
  ASSERT_EQ(res->size(), rs.size());
  for (size_t i = 0; i < rs.size(); i += 499)
    EXPECT_EQ((*res)[i].reward, static_cast<double>(rl::to_json(rs[i], false).dump().size())) << i;

  // A program that does not read its input: an error (no SIGPIPE), saying so.
  auto early = make(command("echo 1"));
  ASSERT_TRUE(early);
  const std::string e = score_error(*early, rs);
  EXPECT_HAS(e, "printed 1 line for 5000 rollouts");
  EXPECT_HAS(e, "stopped reading its input");
}

// ---------------------------------------------------------------- url

std::string http_response(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : " Error") +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// A server on 127.0.0.1 (a port of the system's choosing) that answers one request in a thread:
// `respond` gets the request's head and body and returns the raw response, sent after `delay`.
class OneRequestServer {
 public:
  using Respond = std::function<std::string(const std::string& head, const std::string& body)>;
  explicit OneRequestServer(Respond respond, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd_, 4) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, respond = std::move(respond), delay] { serve(respond, delay); });
  }
  ~OneRequestServer() {
    thread_.join();
    close(fd_);
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

 private:
  // Waits at most 20 s for `fd` to be readable (a test that never connects does not hang).
  static bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 20000) == 1;
  }
  void serve(const Respond& respond, std::chrono::milliseconds delay) {
    if (!readable(fd_)) return;
    const int c = accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    std::string data;
    char buf[65536];
    size_t head_end = std::string::npos, want = 0;
    while (true) {
      if (head_end == std::string::npos && (head_end = data.find("\r\n\r\n")) != std::string::npos) {
        std::string head = data.substr(0, head_end);
        for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        const size_t cl = head.find("content-length:");
        want = head_end + 4 + (cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 15)));
      }
      if (head_end != std::string::npos && data.size() >= want) break;
      if (!readable(c)) break;
      const ssize_t r = recv(c, buf, sizeof(buf), 0);
      if (r <= 0) break;
      data.append(buf, static_cast<size_t>(r));
    }
    const std::string head = data.substr(0, head_end), body = head_end == std::string::npos ? "" : data.substr(head_end + 4);
    const std::string response = respond(head, body);
    std::this_thread::sleep_for(delay);
    for (size_t sent = 0; sent < response.size();) {
      const ssize_t w = send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (w <= 0) break;  // the client gave up (the timeout test)
      sent += static_cast<size_t>(w);
    }
    close(c);
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

RewardOptions url_options(const std::string& url, double timeout_s = 30) {
  RewardOptions o = kind("url");
  o.url = url;
  o.timeout_s = timeout_s;
  return o;
}

// The length of each record's "completion_ids" in a request body, in order (read without a JSON
// parser: the server is independent of kiln's JSON).
std::vector<size_t> completion_lengths(const std::string& body) {
  static const std::string key = "\"completion_ids\":[";
  std::vector<size_t> out;
  for (size_t at = body.find(key); at != std::string::npos; at = body.find(key, at + 1)) {
    const size_t open = at + key.size(), close = body.find(']', open);
    out.push_back(close == open ? 0 : static_cast<size_t>(std::count(body.begin() + open, body.begin() + close, ',')) + 1);
  }
  return out;
}

TEST(RewardUrl, PostsTheRolloutsAndReadsTheRewards) {
  std::string seen_head, seen_body_start;
  OneRequestServer server([&](const std::string& head, const std::string& body) {
    seen_head = head;
    seen_body_start = body.substr(0, 13);
    std::string json = "{\"rewards\": [";
    for (size_t n : completion_lengths(body)) {
      if (json.back() != '[') json += ',';
      json += std::to_string(0.25 * static_cast<double>(n));
    }
    json += "]}";
    return http_response(200, json);
  });
  RewardOptions o = url_options(server.url("/score?v=1"));
  o.length_penalty = 0.125;
  o.length_target = 4;
  auto reward = make(o);
  ASSERT_TRUE(reward);
  const std::vector<Rollout> rs = batch(300);
  auto res = reward->score(rs);
  ASSERT_TRUE(res.ok()) << res.status().message();
  ASSERT_EQ(res->size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    const double n = static_cast<double>(rs[i].completion_ids.size());
    EXPECT_DOUBLE_EQ((*res)[i].reward, 0.25 * n - 0.125 * std::max(0.0, n - 4)) << i;
  }
  EXPECT_HAS(seen_head, "POST /score?v=1 HTTP/1.1");
  EXPECT_EQ(seen_body_start, "{\"rollouts\":[");
  std::string lower = seen_head;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  EXPECT_HAS(lower, "content-type: application/json");
  EXPECT_HAS(reward->describe(), "url http://127.0.0.1:");
}

std::string url_error(const std::string& response, size_t n = 2, double timeout_s = 30,
                      std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  OneRequestServer server([&](const std::string&, const std::string&) { return response; }, delay);
  auto reward = make(url_options(server.url("/r"), timeout_s));
  if (!reward) return "make_reward failed";
  const std::string e = score_error(*reward, batch(n));
  EXPECT_HAS(e, server.url("/r"));  // every error names the URL
  return e;
}

TEST(RewardUrl, FailuresNameTheUrl) {
  std::string e = url_error(http_response(500, "internal oops: " + std::string(500, 'x')));
  EXPECT_HAS(e, "answered HTTP 500");
  EXPECT_HAS(e, "internal oops");
  EXPECT_HAS(e, "(515 bytes)");
  e = url_error(http_response(200, "{\"rewards\": [1, 2"));
  EXPECT_HAS(e, "not JSON");
  e = url_error(http_response(200, "{\"scores\": [1, 2]}"));
  EXPECT_HAS(e, "no \"rewards\" array");
  e = url_error(http_response(200, "{\"rewards\": [1]}"));
  EXPECT_HAS(e, "returned 1 rewards for 2 rollouts");
  e = url_error(http_response(200, "{\"rewards\": [1, \"2\"]}"));
  EXPECT_HAS(e, "rewards[1], for sample 1 (group 0)");
  e = url_error("");  // the server closes without answering
  EXPECT_FALSE(e.empty());

  const auto t0 = std::chrono::steady_clock::now();
  e = url_error(http_response(200, "{\"rewards\": [1, 2]}"), 2, 0.3, std::chrono::milliseconds(1500));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_HAS(e, "timed out after 0.3 s");
  EXPECT_LT(took, 10.0);
}

TEST(RewardUrl, ConnectionRefused) {
  // A port that was just free: nothing listens there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/score";
  close(fd);
  auto reward = make(url_options(url, 5));
  ASSERT_TRUE(reward);
  const std::string e = score_error(*reward, batch(1));
  EXPECT_HAS(e, url);
  EXPECT_HAS(e, "connection refused");
}

}  // namespace
}  // namespace kiln::test
