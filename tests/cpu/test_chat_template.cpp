// Tests of the Jinja chat-template interpreter against references rendered by transformers/jinja2:
// the shared golden cases (testdata/chat_templates/golden.json over the model folders there), the
// cases of tests/reference/make_template_cases.py (testdata/chat_templates/more/cases.json: real
// model-family templates and language-feature micro-templates), and syntax/raise_exception errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/model_text.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::read_file;
using ojson = nlohmann::ordered_json;

// A special token in tokenizer_config.json: a string or {"content": ...}.
std::string token_string(const ojson& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const ojson& t = cfg[key];
  return t.is_string() ? t.get<std::string>() : t.value("content", "");
}

// The reference records errors as "TemplateError: message"; kiln's message is the bare message.
std::string strip_error_type(const std::string& e) {
  size_t p = e.find(": ");
  return p == std::string::npos ? e : e.substr(p + 2);
}

TEST(ChatTemplate, SharedGoldenCases) {
  std::string dir = test::testdata_dir() + "/chat_templates";
  ojson golden = ojson::parse(read_file(dir + "/golden.json"));
  int passed = 0, total = 0;
  for (const ojson& c : golden["cases"]) {
    std::string name = c["template"].get<std::string>(), label = name + "/" + c["case"].get<std::string>();
    std::string folder = dir + "/models/" + name;
    auto tmpl = ChatTemplate::parse(read_file(folder + "/chat_template.jinja"), name);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    ojson cfg = ojson::parse(read_file(folder + "/tokenizer_config.json"));
    ChatTemplateInputs in;
    in.messages = c["messages"];
    in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    in.bos_token = token_string(cfg, "bos_token");
    in.eos_token = token_string(cfg, "eos_token");
    for (const char* k : {"unk_token", "pad_token"})
      if (cfg.contains(k)) in.extra[k] = token_string(cfg, k);
    auto r = apply_chat_template(tmpl.value(), in);
    ++total;
    if (c.contains("error")) {
      ASSERT_FALSE(r.ok()) << label << " rendered but the reference raised";
      EXPECT_EQ(r.status().message(), strip_error_type(c["error"].get<std::string>())) << label;
    } else {
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().message();
      EXPECT_EQ(r.value(), c["rendered"].get<std::string>()) << label;
    }
    passed += !::testing::Test::HasFailure();
  }
  EXPECT_GE(total, 48);
  std::printf("chat template golden cases: %d/%d\n", passed, total);
}

TEST(ChatTemplate, OwnReferenceCases) {
  std::string dir = test::testdata_dir() + "/chat_templates/more";
  ojson cases = ojson::parse(read_file(dir + "/cases.json"));
  int total = 0, failed = 0;
  for (const ojson& c : cases["cases"]) {
    std::string label = c["name"].get<std::string>();
    std::string source = c.contains("template_file") ? read_file(dir + "/" + c["template_file"].get<std::string>())
                                                     : c["source"].get<std::string>();
    auto tmpl = ChatTemplate::parse(source, label);
    ++total;
    if (!tmpl.ok()) {
      ++failed;
      ADD_FAILURE() << label << ": parse failed: " << tmpl.status().message();
      continue;
    }
    Result<std::string> r = std::string();
    if (c.contains("inputs")) {  // through apply_chat_template
      const ojson& x = c["inputs"];
      ChatTemplateInputs in;
      in.messages = x["messages"];
      in.tools = x.value("tools", ojson());
      in.add_generation_prompt = x.value("add_generation_prompt", false);
      in.bos_token = x.value("bos_token", "");
      in.eos_token = x.value("eos_token", "");
      if (x.contains("extra")) in.extra = x["extra"];
      r = apply_chat_template(tmpl.value(), in);
    } else {
      r = tmpl.value().render(c["context"]);
    }
    if (c.contains("error")) {
      if (r.ok()) { ++failed; ADD_FAILURE() << label << " rendered " << r.value() << " but the reference raised"; }
      else if (c.value("error_exact", false) && r.status().message() != c["error"].get<std::string>()) {
        ++failed;
        ADD_FAILURE() << label << ": message " << r.status().message() << " vs " << c["error"];
      }
    } else if (!r.ok()) {
      ++failed;
      ADD_FAILURE() << label << ": " << r.status().message();
    } else if (r.value() != c["expected"].get<std::string>()) {
      ++failed;
      EXPECT_EQ(r.value(), c["expected"].get<std::string>()) << label;
    }
  }
  EXPECT_GE(total, 100);
  std::printf("chat template own cases: %d/%d pass\n", total - failed, total);
}

TEST(ChatTemplate, SyntaxErrorsNameTemplateAndLine) {
  struct Case { const char* src; int line; const char* fragment; };
  const Case cases[] = {
      {"hello\n{% if x %}\nno end", 2, "endif"},
      {"a\nb\n{% frobnicate %}", 3, "unknown tag 'frobnicate'"},
      {"{{ 1 + }}", 1, "unexpected"},
      {"line1\n{{ foo(1, }}", 2, "unexpected"},
      {"{% for x in %}{% endfor %}", 1, "unexpected"},
      {"{% for x in y %}\n{% endif %}", 2, "unknown tag 'endif'"},
      {"{# unclosed comment", 1, "comment"},
      {"{{ 'abc }}", 1, "unexpected"},
      {"\n\n{% set x = (1, 2 %}", 3, "unexpected"},
      {"{% macro m(a=1, b) %}{% endmacro %}", 1, "non-default"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::parse(c.src, "my-model");
    ASSERT_FALSE(t.ok()) << c.src;
    const std::string& m = t.status().message();
    EXPECT_NE(m.find("my-model"), std::string::npos) << m;
    EXPECT_NE(m.find("line " + std::to_string(c.line)), std::string::npos) << c.src << " -> " << m;
    EXPECT_NE(m.find(c.fragment), std::string::npos) << c.src << " -> " << m;
  }
}

TEST(ChatTemplate, RaiseExceptionPassesMessageThrough) {
  auto t = ChatTemplate::parse("{% if messages[0].role != 'user' %}{{ raise_exception('Only user messages: ' ~ messages[0].role) }}{% endif %}ok", "t");
  ASSERT_TRUE(t.ok());
  auto r = t.value().render(ojson{{"messages", ojson::array({ojson{{"role", "system"}, {"content", "x"}}})}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "Only user messages: system");
  auto ok = t.value().render(ojson{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "x"}}})}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value(), "ok");
  // Runtime errors other than raise_exception name the template and line.
  auto bad = ChatTemplate::parse("a\n{{ 1 + 'x' }}", "tmpl-name");
  ASSERT_TRUE(bad.ok());
  auto e = bad.value().render(ojson::object());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tmpl-name, line 2"), std::string::npos) << e.status().message();
}

// Hostile templates end with an error that names the limit, never a crash, hang or overflow; the
// arithmetic that fits gives Python's results.
TEST(ChatTemplate, LimitsEndHostileTemplatesWithClearErrors) {
  auto render = [](const std::string& src, const TemplateLimits& limits = {}) {
    auto t = ChatTemplate::parse(src, "t");
    if (!t.ok()) return Result<std::string>(t.status());
    return t.value().render(ojson::object(), limits);
  };
  auto expect_error = [&](const std::string& src, const std::string& mention, const TemplateLimits& limits = {}) {
    auto r = render(src, limits);
    ASSERT_FALSE(r.ok()) << src;
    EXPECT_NE(r.status().message().find(mention), std::string::npos) << src << ": " << r.status().message();
  };
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_depth");
  // Parsing: nesting is bounded, and a chain of 100,000 operators (a tree as deep) is parsed, freed
  // and refused when rendered.
  expect_error("{{ " + std::string(3000, '(') + "1" + std::string(3000, ')') + " }}", "nest deeper than");
  expect_error("{{ " + std::string(100000, '-') + "1 }}", "nest deeper than");
  expect_error([] {
    std::string s;
    for (int i = 0; i < 3000; ++i) s += "{% if true %}";
    return s;
  }(), "nest deeper than");
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  expect_error(chain + " }}", "max_depth");
  expect_error("{{ 'x' * 100000000000 }}", "max_output_bytes");
  expect_error("{{ 'ab' * 9223372036854775807 }}", "max_output_bytes");
  expect_error("{{ [1, 2] * 100000000000 }}", "max_list_items");
  expect_error("{% set s = 'x' * 1000 %}{% for i in range(100000) %}{{ s }}{% endfor %}", "max_output_bytes");
  // Builders that multiply their input are checked before they build (replace took 1 GB, split of a
  // 60 MB string 8 GB and 45 s, before the check after them).
  expect_error("{{ ('a' * 1000000).replace('a', 'a' * 1000) }}", "max_output_bytes");
  expect_error("{{ ('a' * 1000000)|replace('a', 'a' * 1000) }}", "max_output_bytes");
  expect_error("{{ (['a' * 1000000] * 100)|join }}", "max_output_bytes");
  expect_error("{{ ''.join(['a' * 1000000] * 100) }}", "max_output_bytes");
  expect_error("{{ ('a ' * 3000000).split() }}", "max_list_items");
  expect_error("{{ ('a,' * 3000000).split(',') }}", "max_list_items");
  expect_error("{{ ('a\\n' * 3000000).splitlines() }}", "max_list_items");
  expect_error("{{ ('\"' * 40000000)|tojson }}", "max_output_bytes");  // 40 MB, escaped to 80
  expect_error("{{ 'x\\ny'|indent(999999999) }}", "max_output_bytes");
  TemplateLimits few_loops;
  few_loops.max_loop_iterations = 20000;
  expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_loop_iterations",
               few_loops);
  expect_error("{{ 9223372036854775807 + 1 }}", "integer overflow");
  expect_error("{{ 4611686018427387904 * 2 }}", "integer overflow");
  expect_error("{{ -9223372036854775807 - 2 }}", "integer overflow");
  expect_error("{{ 3 ** 40 }}", "integer overflow");
  expect_error("{{ -(-9223372036854775807 - 1) }}", "integer overflow");
  // Smaller limits apply as given.
  TemplateLimits small;
  small.max_output_bytes = 10;
  expect_error("{{ 'x' * 11 }}", "max_output_bytes", small);
  small = TemplateLimits{};
  small.max_loop_iterations = 5;
  expect_error("{% for i in range(6) %}{% endfor %}", "max_loop_iterations", small);
  // Within the limits: Python's values.
  auto ok = render("{{ 2 ** 62 }} {{ 1 ** 1000000000000 }} {{ (-1) ** 1000000000001 }} {{ 0 ** 0 }} "
                   "{{ 9223372036854775806 + 1 }} {{ (-9223372036854775807 - 1) % -1 }} {{ 'ab' * 3 }} {{ 'x' * -2 }}|");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok.value(), "4611686018427387904 1 -1 1 9223372036854775807 0 ababab |");
  auto deep = render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(50) }}");
  ASSERT_TRUE(deep.ok()) << deep.status().message();
  EXPECT_EQ(deep.value(), "done");
}

// A namespace can hold itself or a chain of others as long as the loops allow: printing guards
// cycles as Python does, tojson refuses them, and nothing recurses without bound (freeing included).
TEST(ChatTemplate, SelfReferencesAndLongChainsOfNamespaces) {
  auto render = [](const std::string& src) {
    auto t = ChatTemplate::parse(src, "t");
    if (!t.ok()) return Result<std::string>(t.status());
    return t.value().render(ojson::object());
  };
  auto cyc = render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}|{{ ns == ns }}");
  ASSERT_TRUE(cyc.ok()) << cyc.status().message();
  EXPECT_EQ(cyc.value(), "<Namespace {'a': 1, 'me': <Namespace {...}>}>|True");
  auto js = render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}");
  ASSERT_FALSE(js.ok());
  EXPECT_NE(js.status().message().find("Circular reference"), std::string::npos) << js.status().message();
  const std::string chain =
      "{% set root = namespace(c=none) %}{% set st = namespace(cur=root) %}"
      "{% for i in range(100000) %}{% set tmp = st.cur %}{% set nxt = namespace(c=none) %}"
      "{% set tmp.c = nxt %}{% set st.cur = nxt %}{% endfor %}";
  auto deep = render(chain + "{{ root.c.c.c.c is defined }}|{{ root }}");
  ASSERT_TRUE(deep.ok()) << deep.status().message();
  EXPECT_EQ(deep.value().substr(0, 5), "True|");
  EXPECT_NE(deep.value().find("..."), std::string::npos);
}

TEST(ChatTemplate, DeeplyNestedMessagesAreAnError) {
  auto t = ChatTemplate::parse("{{ messages }}", "t");
  ASSERT_TRUE(t.ok());
  ojson deep = ojson::array();
  for (int i = 0; i < 30000; ++i) deep = ojson::array({std::move(deep)});
  ChatTemplateInputs in;
  in.messages = ojson::array({ojson{{"role", "user"}, {"content", std::move(deep)}}});
  auto r = apply_chat_template(t.value(), in);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nest deeper"), std::string::npos) << r.status().message();
}

TEST(ChatTemplate, StrftimeNowAndThreadSafeRender) {
  auto t = ChatTemplate::parse("{{ strftime_now('%Y') }}|{% for m in messages %}{{ m.content }}{% endfor %}", "t");
  ASSERT_TRUE(t.ok());
  ojson ctx{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "é"}}})}};
  auto r = t.value().render(ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().size(), 4u + 1 + 2);
  EXPECT_EQ(r.value().substr(0, 2), "20");
}

// The special tokens of tokenizer_config.json reach the template as transformers 5.17 passes them
// (its special_tokens_map, then the kwargs): a null bos_token is undefined, sep/cls/mask and the
// model-specific *_token strings and extra_special_tokens are there, AddedToken objects give their
// content, a non-string *_token is left out; a documents kwarg is documents (not None). The expected
// strings are AutoTokenizer(...).apply_chat_template(..., tokenize=False) on the same folder.
TEST(ChatTemplate, SpecialTokensAndDocumentsAsTransformersPassesThem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kiln_special_tokens_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(test::testdata_dir() + "/chat_templates/models/chatml/tokenizer.json", dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": null,
    "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": false, "normalized": false, "rstrip": false,
                  "single_word": false, "special": true},
    "pad_token": "<|endoftext|>", "sep_token": "<sep>",
    "cls_token": {"__type": "AddedToken", "content": "<cls>", "lstrip": false, "normalized": false, "rstrip": false,
                  "single_word": false, "special": true},
    "mask_token": "<mask>", "image_token": "<img>", "not_a_token": "x", "odd_token": 5,
    "extra_special_tokens": {"audio_token": "<aud>"}})";
  std::ofstream(dir / "chat_template.jinja")
      << "[{{ bos_token is defined }}][{{ eos_token }}][{{ sep_token }}][{{ cls_token }}][{{ mask_token }}][{{ pad_token }}]"
         "[{{ unk_token is defined }}][{{ image_token }}][{{ audio_token }}][{{ not_a_token is defined }}]"
         "[{{ odd_token is defined }}][{{ documents }}]";
  Result<ModelText> text = ModelText::load(dir.string());
  ASSERT_TRUE(text.ok()) << text.status().message();
  const ojson messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  Result<std::string> plain = text.value().render_chat(messages, nullptr, false);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain.value(), "[False][<|im_end|>][<sep>][<cls>][<mask>][<|endoftext|>][False][<img>][<aud>][True][False][None]");
  const ojson kwargs = ojson::parse(R"({"documents": [{"title": "a", "text": "b"}], "sep_token": "S"})");
  Result<std::string> with_docs = text.value().render_chat(messages, nullptr, false, "", kwargs);
  ASSERT_TRUE(with_docs.ok()) << with_docs.status().message();
  EXPECT_EQ(with_docs.value(),
            "[False][<|im_end|>][S][<cls>][<mask>][<|endoftext|>][False][<img>][<aud>][True][False][[{'title': 'a', 'text': 'b'}]]");
  Result<std::string> bad_docs = text.value().render_chat(messages, nullptr, false, "", ojson{{"documents", "text"}});
  EXPECT_FALSE(bad_docs.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
