// Encode throughput of kiln's tokenizer on one thread, in MB/s, for the golden tokenizers on the
// text that bench/bench_tokenizer_hf.py writes (run that first; it measures the Python `tokenizers`
// library on the same text and units of work: "whole" = one encode of the whole text, "lines" = one
// encode per line). Prints one JSON object.
// Usage (from the repository root): bench_tokenizer --text /tmp/kiln_tok_bench.txt [--dir testdata/tokenizers] [--repeats 3]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "model/tokenizer.h"

using namespace kiln;

int main(int argc, char** argv) {
  CLI::App app{"kiln tokenizer encode benchmark"};
  std::string text_path = "/tmp/kiln_tok_bench.txt";
  std::string dir = "testdata/tokenizers";  // run from the repository root, or pass --dir
  int repeats = 3;
  app.add_option("--text", text_path, "UTF-8 text file (made by bench/bench_tokenizer_hf.py)");
  app.add_option("--dir", dir, "folder of the golden tokenizer.json files");
  app.add_option("--repeats", repeats, "repetitions (the best is reported)");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: error: cannot read '%s': run bench/bench_tokenizer_hf.py --text %s first\n",
                 text_path.c_str(), text_path.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string_view> lines;  // keeping the newline, as Python's splitlines(keepends=True)
  for (size_t a = 0; a < text.size();) {
    size_t b = text.find('\n', a);
    b = b == std::string::npos ? text.size() : b + 1;
    lines.push_back(std::string_view(text).substr(a, b - a));
    a = b;
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  nlohmann::json results = nlohmann::json::array();
  for (const char* name : {"bytelevel-bpe", "sentencepiece-bpe"}) {
    auto tok = Tokenizer::from_file(dir + "/" + name + ".tokenizer.json");
    if (!tok.ok()) {
      std::fprintf(stderr, "bench_tokenizer: error: %s\n", tok.status().message().c_str());
      return 1;
    }
    for (const char* unit : {"whole", "lines"}) {
      double best = 1e30;
      size_t ntok = 0;
      for (int r = 0; r < repeats; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        ntok = 0;
        if (std::string(unit) == "whole") {
          ntok = tok.value()->encode(text, false).value().size();
        } else {
          for (auto line : lines) ntok += tok.value()->encode(line, false).value().size();
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      results.push_back({{"tokenizer", name}, {"unit", unit}, {"mb", mb}, {"tokens", ntok},
                         {"seconds", best}, {"mb_per_s", mb / best}});
    }
  }
  std::cout << nlohmann::json({{"library", "kiln"}, {"threads", 1}, {"results", results}}).dump(1) << "\n";
  return 0;
}
