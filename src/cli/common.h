// Helpers shared by the kiln subcommands: error printing, id-list parsing, loading a model (and its
// text side) from flags. Subcommands parse flags and call the layers below; nothing else lives here.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "infer/engine.h"
#include "infer/sampling_defaults.h"
#include "kernels/ops.h"
#include "model/model_text.h"
#include "model/transformer.h"

namespace kiln::cli {

// Prints "kiln: error: <message>" on stderr; returns the exit code 1.
int fail(const Status& s);
// "1, 2,3" -> {1, 2, 3}; an error naming `flag` on anything that is not an integer.
Result<std::vector<int32_t>> parse_ids(const std::string& text, const char* flag);
// A flag's unsigned 64-bit value (seeds): decimal digits only, in range, else an error naming it.
Result<uint64_t> parse_u64(const std::string& text, const char* flag);
// Reads a whole file, or stdin for "-".
Result<std::string> read_text(const std::string& path);

// The tiny model shipped beside the binary (<prefix>/share/kiln/tiny-llama, put there by the build
// and by cmake --install): the default of the commands that can run without a model named, found
// relative to the binary wherever it is installed. Empty when the binary's path is unknown.
std::string bundled_model_dir();

struct ModelFlags {
  std::string model_dir;
  std::string device = "cpu";
  bool random_weights = false;
  std::string weight_seed = "0";  // parsed (range-checked) by load_model
  void add(CLI::App* cmd, const std::string& default_model);
};

// Sampling flags shared by generate and chat.
struct SamplingFlags {
  float temperature;
  int32_t top_k = 0;
  float top_p;
  std::string seed;  // as given: parsed (range-checked) by apply(); empty: random (set before add() for a default)
  SamplingFlags(float default_temperature, float default_top_p)
      : temperature(default_temperature), top_p(default_top_p) {}
  void add(CLI::App* cmd);
  // Sets the request's sampling fields; a random seed when --seed was not given.
  Status apply(GenerationRequest* request) const;
  // The model's recommended sampling (generation_config.json) where --temperature, --top-k and
  // --top-p were not given, and its min_p and repetition_penalty.
  void prefer_model_defaults(const SamplingDefaults& defaults, GenerationRequest* request) const;

 private:
  CLI::Option* temperature_option_ = nullptr;
  CLI::Option* top_k_option_ = nullptr;
  CLI::Option* top_p_option_ = nullptr;
};

// Prints decoded text to stdout as tokens arrive (only complete UTF-8; special tokens skipped).
class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer& tokenizer) : decoder_(tokenizer, /*skip_special_tokens=*/true) {}
  // Prints what `id` completes; false (stop generating) on a decoding error, kept in status().
  bool push(int32_t id);
  // Prints the rest and a newline.
  void finish();
  const Status& status() const { return status_; }

 private:
  StreamingDecoder decoder_;
  Status status_;
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
};
Result<LoadedModel> load_model(const ModelFlags& f);

// "kiln 0.1.0 (git <commit>, CUDA on: sm_90a)": what kiln --version prints.
std::string version_text();

// Each subcommand registers its flags and returns the function that runs it once parsed.
using Runner = std::function<int()>;
Runner add_generate(CLI::App& app);
Runner add_score(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_detokenize(CLI::App& app);
Runner add_chat_template(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_train(CLI::App& app);
Runner add_rl(CLI::App& app);
Runner add_demo(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_run_batch(CLI::App& app);
Runner add_preprocess(CLI::App& app);
Runner add_plot(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_info(CLI::App& app);

}  // namespace kiln::cli
