// Evaluation on the inference engine (kiln eval): each task reads a JSONL file (or preprocessed
// shards), runs its requests through the engine with many in flight, and returns its figures.
//
//   perplexity  token-level negative log-likelihood of documents (lines {"text": ...} of a .jsonl
//               file, plain-text lines of any other file, or a preprocessed directory's split),
//               perplexity and bits per byte; a document longer than the context is scored in
//               windows of the context that advance by `stride` tokens, each token scored once with
//               the longest context its window gives (transformers' sliding-window perplexity).
//   choice      multiple-choice log-likelihood (lm-evaluation-harness's loglikelihood requests):
//               lines {"context": text or "messages": chat, "choices": [text...], "answer": i};
//               each choice's continuation tokens scored given the context, accuracy by the sum
//               (acc) and by the sum over the choice's length in characters (acc_norm).
//   generate    lines with a prompt (rl/prompts.h's forms) and a reference answer, generated with
//               stop strings and scored by the RL rewards' verifiers (rl/reward.h: the `answer`
//               numeric match or a `regex`), pass@k from n samples per prompt.
//
// Ownership: the caller keeps the engine and the text side alive while a task runs.
// Thread safety: a task drives the engine from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "infer/engine.h"
#include "model/config.h"
#include "model/model_text.h"

namespace kiln::eval {

struct EvalContext {
  Engine* engine = nullptr;
  const ModelText* text = nullptr;  // null when the model folder has no tokenizer
  const ModelConfig* config = nullptr;
  std::string model_dir;
  int32_t max_in_flight = 1024;  // requests submitted and not yet finished, at most
  // Called after every finished item (done, total).
  std::function<void(int64_t, int64_t)> progress;
};

// A task's figures ("results"), per-item records ("details", one JSON object per item), and the
// number of items.
struct TaskOutput {
  nlohmann::ordered_json results;
  std::vector<nlohmann::ordered_json> details;
  int64_t items = 0;
};

struct PerplexityOptions {
  std::string data;           // a .jsonl file, a text file or a preprocessed directory
  std::string split = "val";  // of a preprocessed directory
  int32_t context = 0;        // window length in tokens; 0: the engine's longest sequence
  int32_t stride = 0;         // tokens a window advances; 0: the context (disjoint windows)
};
Result<TaskOutput> perplexity(const EvalContext& ctx, const PerplexityOptions& o);

struct ChoiceOptions {
  std::string data;
  int32_t context = 0;  // longest scored sequence; longer ones lose their oldest context tokens
};
Result<TaskOutput> choice(const EvalContext& ctx, const ChoiceOptions& o);

struct GenerateOptions {
  std::string data;
  bool chat = false;                  // "prompt" text as one user message through the chat template
  std::string scorer = "answer";      // "answer" (numeric match) or "regex"
  std::string answer_field = "answer";
  std::string pattern;                // regex
  int32_t samples = 1;                // n completions per prompt
  std::vector<int32_t> pass_at;       // k values (each <= samples); empty: 1 and n
  GenerationRequest sampling;         // max_tokens, temperature, top_k, top_p, seed, stop (prompt unused)
};
Result<TaskOutput> generate(const EvalContext& ctx, const GenerateOptions& o);

// pass@k of one prompt with c correct among n samples: 1 - C(n - c, k) / C(n, k) (the unbiased
// estimator of Chen et al., 2021). Requires 1 <= k <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

// The engine's results for one request.
struct Finished {
  std::vector<float> prompt_logprobs;
  std::vector<int32_t> ids;
  std::string text, finish_reason, error;
};
// Runs `n` requests with at most ctx.max_in_flight outstanding: make(i) builds request i; done(i, r)
// receives its result, in order of i. The first error (of make, done or the engine) stops the run.
Status run_requests(const EvalContext& ctx, int64_t n, const std::function<Result<GenerationRequest>(int64_t)>& make,
                    const std::function<Status(int64_t, Finished&&)>& done);

// Calls fn(line number, line) for every line of `path` that is not blank (1-based numbers); stops at
// fn's first error. A file that cannot be read is an error naming it.
Status for_each_line(const std::string& path, const std::function<Status(int64_t, const std::string&)>& fn);
// The line parsed as a JSON object (ordered), or an error naming "path:line".
Result<nlohmann::ordered_json> parse_object_line(const std::string& line, const std::string& where);

}  // namespace kiln::eval
