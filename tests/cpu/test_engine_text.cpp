// The engine's text side on testdata/tiny-tools, whose greedy replies are known (testdata/FIXTURES.md):
// special tokens in the event text on request, the EOS that ends a request never shown, which stop
// string ended a request, and stream listeners called for every event.
#include <gtest/gtest.h>

#include <atomic>

#include "infer/engine.h"
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
