// The engine's text side on testdata/tiny-tools, whose greedy replies are known (testdata/FIXTURES.md):
// special tokens in the event text on request, the EOS that ends a request never shown, which stop
// string ended a request, and stream listeners called for every event.
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "infer/engine.h"
#include "infer/stop_strings.h"
#include "model/model_text.h"
#include "test_util.h"

namespace kiln::test {
namespace {

class EngineText : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(false);
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be_, testdata_dir() + "/tiny-tools");
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::shared_ptr<const Transformer>(std::move(m).value());
    Result<ModelText> t = ModelText::load(testdata_dir() + "/tiny-tools");
    ASSERT_TRUE(t.ok()) << t.status().message();
    text_ = std::make_unique<ModelText>(std::move(t).value());
    Result<std::unique_ptr<Engine>> e = Engine::create(model_, &text_->tokenizer(), text_->stop_ids(), EngineOptions{});
    ASSERT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(e).value();
    Result<std::string> prompt = text_->render_chat(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi!"}])"),
                                                    nlohmann::ordered_json(), true);
    ASSERT_TRUE(prompt.ok());
    prompt_ = *text_->tokenizer().encode(*prompt, false);
  }
  // The text and the final event of one request.
  std::pair<std::string, EngineEvent> run(GenerationRequest r) {
    r.prompt = prompt_;
    Result<std::shared_ptr<RequestStream>> s = engine_->submit(r);
    EXPECT_TRUE(s.ok()) << s.status().message();
    std::string text;
    EngineEvent last;
    while (std::optional<EngineEvent> e = (*s)->next()) {
      text += e->text;
      if (e->finished) last = *e;
    }
    return {text, last};
  }
  std::unique_ptr<Backend> be_;
  std::shared_ptr<const Transformer> model_;
  std::unique_ptr<ModelText> text_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> prompt_;
};

constexpr const char* kGreeting = "Hello! How can I help you today?";

TEST_F(EngineText, SpecialTokensOnRequestButNeverTheEndingEos) {
  GenerationRequest r;
  r.max_tokens = 20;
  EXPECT_EQ(run(r).first, kGreeting);
  r.skip_special_tokens = false;
  EXPECT_EQ(run(r).first, kGreeting);  // the <|im_end|> that ends it shows nothing
  // Past the EOS (ignored), the <|im_end|> tokens are text like any other.
  r.ignore_eos = true;
  r.max_tokens = 11;
  const std::string shown = run(r).first;
  EXPECT_EQ(shown.rfind(std::string(kGreeting) + "<|im_end|>", 0), 0u) << shown;
  r.skip_special_tokens = true;
  EXPECT_EQ(run(r).first.find("<|im_end|>"), std::string::npos);
}

TEST_F(EngineText, FinalEventNamesTheStopString) {
  GenerationRequest r;
  r.max_tokens = 20;
  r.stop = {"you", " can", "zzz"};  // " can" comes first in the text
  auto [text, last] = run(r);
  EXPECT_EQ(text, "Hello! How");
  EXPECT_EQ(last.finish_reason, "stop");
  EXPECT_EQ(last.stop_string, " can");
  r.stop.clear();
  EXPECT_EQ(run(r).second.stop_string, "");  // ended by EOS
}

TEST_F(EngineText, StopStringsAreBounded) {
  GenerationRequest r;
  r.prompt = prompt_;
  r.stop.assign(kMaxStopStrings + 1, "x");
  Result<std::shared_ptr<RequestStream>> s = engine_->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at most 64 stop strings"), std::string::npos) << s.status().message();
  r.stop = {std::string(kMaxStopStringBytes + 1, 'a')};
  s = engine_->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at most 1024 bytes"), std::string::npos) << s.status().message();
}

// StopStrings against a brute force over the whole text after every piece, on random texts and
// strings of a two-letter alphabet (overlaps, repeats, strings that begin other strings): the text
// released so far is the text minus its longest tail that is a proper beginning of a string, and
// the stop is at the earliest start of any string in the text (the first listed on a tie).
TEST(StopStrings, AgreeWithABruteForceOverTheWholeText) {
  std::mt19937 rng(7);
  auto word = [&](int lo, int hi) {
    std::string w(std::uniform_int_distribution<int>(lo, hi)(rng), 'a');
    for (char& c : w) c = "ab"[rng() % 2];
    return w;
  };
  int stopped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    for (int i = std::uniform_int_distribution<int>(1, 4)(rng); i > 0; --i) stops.push_back(word(1, 6));
    StopStrings m(stops);
    std::string text, released;
    bool done = false;
    for (int p = 0; p < 12 && !done; ++p) {
      const std::string piece = word(0, 4);
      text += piece;
      StopStrings::Update u = m.push(piece);
      released += u.text;
      // The brute force.
      size_t first = std::string::npos;
      std::string matched;
      for (const std::string& s : stops) {
        const size_t at = text.find(s);
        if (at < first) first = at, matched = s;
      }
      if (first != std::string::npos) {
        ASSERT_TRUE(u.stopped) << "text " << text;
        EXPECT_EQ(u.matched, matched) << "text " << text;
        EXPECT_EQ(released, text.substr(0, first)) << "text " << text;
        done = true;
        ++stopped;
        break;
      }
      ASSERT_FALSE(u.stopped) << "text " << text;
      size_t hold = 0;
      for (const std::string& s : stops)
        for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
          if (text.compare(text.size() - k, k, s, 0, k) == 0) hold = k;
      EXPECT_EQ(released, text.substr(0, text.size() - hold)) << "text " << text;
    }
    if (!done) EXPECT_EQ(released + m.flush(), text);
  }
  EXPECT_GT(stopped, 1000);
}

TEST_F(EngineText, ListenerRunsForEveryEvent) {
  GenerationRequest r;
  r.prompt = prompt_;
  r.max_tokens = 20;
  Result<std::shared_ptr<RequestStream>> s = engine_->submit(r);
  ASSERT_TRUE(s.ok());
  std::atomic<int> calls{0};
  (*s)->set_listener([&] { ++calls; });
  int events = 0;
  while (std::optional<EngineEvent> e = (*s)->next()) ++events;
  // Events pushed before the listener was set are not announced; every later one is.
  EXPECT_GE(calls.load(), 1);
  EXPECT_LE(calls.load(), events);
  (*s)->set_listener(nullptr);
}

}  // namespace
}  // namespace kiln::test
