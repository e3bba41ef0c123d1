// Structured outputs through the engine (GenerationRequest::json_schema) on testdata/tiny-tools:
// greedy and sampled outputs are JSON values of the schema (checked field by field here, apart from
// the matcher), batched requests draw what each draws alone (with and without preemption), and
// requests that cannot have a schema are refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "infer/engine.h"
#include "model/model_text.h"
#include "test_util.h"

namespace kiln::test {
namespace {

using nlohmann::json;

constexpr const char* kSchema = R"({"type": "object", "properties": {
    "ok": {"type": "boolean"}, "n": {"type": "integer"},
    "color": {"enum": ["red", "green", "blue"]}, "tag": {"type": "string", "maxLength": 6}},
  "required": ["ok", "color"]})";

// Whether `text` is a JSON value of kSchema (with additionalProperties false, kiln's policy).
::testing::AssertionResult follows_schema(const std::string& text) {
  json v;
  try {
    v = json::parse(text);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not JSON: " << text;
  }
  if (!v.is_object()) return ::testing::AssertionFailure() << "not an object: " << text;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "ok" && it.key() != "n" && it.key() != "color" && it.key() != "tag")
      return ::testing::AssertionFailure() << "key " << it.key() << ": " << text;
  if (!v.contains("ok") || !v["ok"].is_boolean()) return ::testing::AssertionFailure() << "ok: " << text;
  if (!v.contains("color") || !v["color"].is_string()) return ::testing::AssertionFailure() << "color: " << text;
  const std::string c = v["color"];
  if (c != "red" && c != "green" && c != "blue") return ::testing::AssertionFailure() << "color value: " << text;
  if (v.contains("n") && !v["n"].is_number_integer()) return ::testing::AssertionFailure() << "n: " << text;
  if (v.contains("tag")) {
    if (!v["tag"].is_string()) return ::testing::AssertionFailure() << "tag: " << text;
    size_t cps = 0;
    for (unsigned char ch : v["tag"].get<std::string>()) cps += (ch & 0xC0) != 0x80;
    if (cps > 6) return ::testing::AssertionFailure() << "tag length: " << text;
  }
  return ::testing::AssertionSuccess();
}

class EngineStructured : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(false);
    Result<std::unique_ptr<Transformer>> m = Transformer::load(*be_, testdata_dir() + "/tiny-tools");
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::shared_ptr<const Transformer>(std::move(m).value());
    Result<ModelText> t = ModelText::load(testdata_dir() + "/tiny-tools");
    ASSERT_TRUE(t.ok()) << t.status().message();
    text_ = std::make_unique<ModelText>(std::move(t).value());
    Result<std::string> prompt = text_->render_chat(
        nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Give me a color as JSON."}])"), nlohmann::ordered_json(), true);
    ASSERT_TRUE(prompt.ok());
    prompt_ = *text_->tokenizer().encode(*prompt, false);
    Result<std::shared_ptr<const structured::JsonSchema>> s = structured::JsonSchema::compile(json::parse(kSchema));
    ASSERT_TRUE(s.ok()) << s.status().message();
    schema_ = *s;
  }
  std::unique_ptr<Engine> engine(EngineOptions o = {}) {
    Result<std::unique_ptr<Engine>> e = Engine::create(model_, &text_->tokenizer(), text_->stop_ids(), o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  GenerationRequest request(uint64_t seed, bool constrained = true) const {
    GenerationRequest r;
    r.prompt = prompt_;
    r.max_tokens = 400;  // room for the whitespace runs (up to 16 bytes each) a tiny model likes
    r.temperature = seed == 0 ? 0.0f : 1.0f;
    r.seed = seed;
    if (constrained) r.json_schema = schema_;
    return r;
  }
  struct Output {
    std::vector<int32_t> ids;
    std::string text, finish;
  };
  // Submits every request at once, then reads each stream.
  static std::vector<Output> run(Engine& e, const std::vector<GenerationRequest>& rs) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerationRequest& r : rs) {
      Result<std::shared_ptr<RequestStream>> s = e.submit(r);
      EXPECT_TRUE(s.ok()) << s.status().message();
      streams.push_back(*s);
    }
    std::vector<Output> out(rs.size());
    for (size_t i = 0; i < rs.size(); ++i) {
      while (std::optional<EngineEvent> ev = streams[i]->next()) {
        for (const GeneratedToken& t : ev->tokens) out[i].ids.push_back(t.id);
        out[i].text += ev->text;
        if (ev->finished) out[i].finish = ev->finish_reason;
      }
    }
    return out;
  }
  std::unique_ptr<Backend> be_;
  std::shared_ptr<const Transformer> model_;
  std::unique_ptr<ModelText> text_;
  std::vector<int32_t> prompt_;
  std::shared_ptr<const structured::JsonSchema> schema_;
};

TEST_F(EngineStructured, GreedyAndSampledOutputsFollowTheSchema) {
  std::unique_ptr<Engine> e = engine();
  ASSERT_TRUE(e);
  std::vector<GenerationRequest> rs;
  for (uint64_t seed = 0; seed < 12; ++seed) rs.push_back(request(seed));
  const std::vector<Output> out = run(*e, rs);
  int stopped = 0;
  for (const Output& o : out) {
    if (o.finish == "length") continue;  // a long string or number: unfinished, as asked
    EXPECT_EQ(o.finish, "stop");
    EXPECT_TRUE(follows_schema(o.text));
    ++stopped;
  }
  EXPECT_GE(stopped, 8);
  EXPECT_EQ(out[0].finish, "stop") << out[0].text;  // greedy
}

TEST_F(EngineStructured, BatchedRequestsDrawWhatEachDrawsAloneWithAndWithoutPreemption) {
  std::vector<GenerationRequest> rs;
  for (uint64_t seed = 0; seed < 8; ++seed) rs.push_back(request(seed, seed % 3 != 2));  // unconstrained ones too
  std::vector<Output> alone;
  {
    std::unique_ptr<Engine> e = engine();
    for (const GenerationRequest& r : rs) alone.push_back(run(*e, {r})[0]);
  }
  EngineOptions small;
  small.kv_tokens = static_cast<int64_t>(prompt_.size()) + 400 + 8;  // one request's longest: preemption
  small.page_size = 4;
  for (EngineOptions o : {EngineOptions{}, small}) {
    std::unique_ptr<Engine> e = engine(o);
    const std::vector<Output> together = run(*e, rs);
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(together[i].ids, alone[i].ids) << "request " << i << " kv_tokens " << o.kv_tokens;
      EXPECT_EQ(together[i].finish, alone[i].finish) << "request " << i;
    }
    if (o.kv_tokens > 0) {
      EXPECT_GT(e->stats().preemptions, 0);
    }
  }
}

TEST_F(EngineStructured, JsonObjectModeGivesAnObject) {
  std::unique_ptr<Engine> e = engine();
  GenerationRequest r = request(0, false);
  r.json_schema = structured::JsonSchema::any_object();
  r.max_tokens = 200;
  const Output o = run(*e, {r})[0];
  if (o.finish == "stop") {
    EXPECT_TRUE(json::parse(o.text, nullptr, false).is_object()) << o.text;
  } else {
    EXPECT_EQ(o.text.rfind("{", 0), 0u) << o.text;
  }
}

TEST_F(EngineStructured, NeedsATokenizer) {
  Result<std::unique_ptr<Engine>> e = Engine::create(model_, nullptr, text_->stop_ids(), EngineOptions{});
  ASSERT_TRUE(e.ok());
  Result<std::shared_ptr<RequestStream>> s = (*e)->submit(request(0));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tokenizer"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace kiln::test
