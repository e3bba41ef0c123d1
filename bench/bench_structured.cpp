// Structured outputs' host cost: the token mask of every step of a JSON text written under a
// schema, on a tokenizer's vocabulary (infer/structured/token_masks.h). Prints JSON: the time to
// build the vocabulary's tries, and per step (cold: a fresh cache; warm: the same text again) the
// mean, p50, p99 and max milliseconds of TokenMasker::allowed, with the cache's hits.
//   bench_structured --tokenizer tokenizer.json [--schema FILE.json] [--text FILE] [--repeat N]
// Without --schema / --text: a built-in object schema and a matching text with long strings.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "infer/structured/token_masks.h"
#include "model/tokenizer.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
  "tags": {"type": "array", "items": {"type": "string"}},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                               "zip": {"type": "string", "maxLength": 10}}, "required": ["city"]},
  "status": {"enum": ["active", "inactive", "pending"]}, "score": {"type": "number"}},
  "required": ["name", "age", "tags", "status"]})";
constexpr const char* kText =
    R"({"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada@example.org", )"
    R"("tags": ["mathematics", "analytical engine", "poetical science", "first programmer"], )"
    R"("address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"}, )"
    R"("status": "inactive", "score": 98.75})";

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"structured outputs: token mask cost"};
  std::string tokenizer_path, schema_path, text_path;
  int repeat = 2;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--schema", schema_path, "JSON schema file (default: a built-in object schema)");
  app.add_option("--text", text_path, "a JSON text of the schema (default: the built-in one's)");
  app.add_option("--repeat", repeat, "passes over the text (the first with a cold cache)");
  CLI11_PARSE(app, argc, argv);
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_file(tokenizer_path);
  if (!tok.ok()) return std::fprintf(stderr, "kiln: %s\n", tok.status().message().c_str()), 1;
  const nlohmann::json schema_json = nlohmann::json::parse(schema_path.empty() ? std::string(kSchema) : read(schema_path));
  const std::string text = text_path.empty() ? std::string(kText) : read(text_path);
  Result<std::shared_ptr<const structured::JsonSchema>> schema = structured::JsonSchema::compile(schema_json);
  if (!schema.ok()) return std::fprintf(stderr, "kiln: %s\n", schema.status().message().c_str()), 1;
  Result<std::vector<int32_t>> ids = (*tok)->encode(text, false);
  if (!ids.ok()) return std::fprintf(stderr, "kiln: %s\n", ids.status().message().c_str()), 1;

  const auto t0 = Clock::now();
  std::shared_ptr<const structured::TokenVocabulary> vocab = structured::TokenVocabulary::build(**tok, (*tok)->vocab_size());
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  structured::TokenMasker masker(vocab);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->words()));
  nlohmann::json passes = nlohmann::json::array();
  for (int pass = 0; pass < repeat; ++pass) {
    structured::JsonMatcher m(*schema);
    std::vector<double> ms;
    const int64_t hits0 = masker.cache_hits(), misses0 = masker.cache_misses();
    for (int32_t id : *ids) {
      const auto a = Clock::now();
      masker.allowed(m, {}, mask.data());
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
      if (!(mask[id >> 5] >> (id & 31) & 1))
        return std::fprintf(stderr, "kiln: the text's token %d is not allowed by its own mask\n", id), 1;
      if (!m.advance(*(*tok)->token_bytes(id))) return std::fprintf(stderr, "kiln: the text does not follow the schema\n"), 1;
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double x : ms) sum += x;
    passes.push_back({{"steps", ms.size()},
                      {"mean_ms", sum / ms.size()},
                      {"p50_ms", sorted[sorted.size() / 2]},
                      {"p99_ms", sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)]},
                      {"max_ms", sorted.back()},
                      {"cache_hits", masker.cache_hits() - hits0},
                      {"cache_misses", masker.cache_misses() - misses0}});
  }
  nlohmann::json out = {{"tokenizer", tokenizer_path}, {"vocab", (*tok)->vocab_size()}, {"build_ms", build_ms}, {"passes", passes}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
