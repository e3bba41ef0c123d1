// kiln eval --task perplexity (eval.h): documents scored in windows of the context.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/sha256.h"
#include "eval/eval.h"
#include "train/dataset.h"

namespace kiln::eval {
namespace {

struct Document {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;  // empty: every token after the first is a target
  int64_t bytes = -1;           // UTF-8 bytes of its text; -1: unknown (pre-tokenized data)
  int64_t line = 0;             // where it came from: line, or row of a preprocessed split
};

Result<std::vector<Document>> read_text_documents(const EvalContext& ctx, const std::string& path) {
  if (!ctx.text) return invalid_argument("perplexity over text needs the model's tokenizer.json");
  const bool jsonl = std::filesystem::path(path).extension() == ".jsonl";
  std::vector<Document> docs;
  KILN_RETURN_IF_ERROR(for_each_line(path, [&](int64_t number, const std::string& line) -> Status {
    const std::string where = path + ":" + std::to_string(number);
    std::string text = line;
    if (jsonl) {
      KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json j, parse_object_line(line, where));
      if (!j.contains("text") || !j["text"].is_string())
        return invalid_argument(where + ": a perplexity line needs \"text\" (a string)");
      text = j["text"].get<std::string>();
    }
    Result<std::vector<int32_t>> ids = ctx.text->tokenizer().encode(text, /*add_special_tokens=*/true);
    if (!ids.ok()) return invalid_argument(where + ": " + ids.status().message());
    docs.push_back(Document{std::move(ids).value(), {}, static_cast<int64_t>(text.size()), number});
    return Status::Ok();
  }));
  return docs;
}

// A preprocessed split's documents, with their own targets (every token but a document's first, or
// a chat split's assistant tokens).
Result<std::vector<Document>> read_preprocessed_documents(const EvalContext& ctx, const std::string& dir,
                                                          const std::string& split) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> data, TrainingData::open(dir, split, *ctx.config, ctx.model_dir));
  std::vector<Document> docs;
  for (int64_t r = 0; r < data->rows(); ++r) {
    const TrainExample ex = data->example(r, /*every_token=*/false);
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      if (ex.position_ids[t] == 0) docs.push_back(Document{{}, {}, -1, r + 1});
      docs.back().ids.push_back(ex.input_ids[t]);
      docs.back().target.push_back(ex.labels[t] >= 0 ? 1 : 0);
    }
  }
  return docs;
}

struct Window {
  int32_t doc = 0, begin = 0, end = 0, from = 0;  // tokens [begin, end) scored from index `from`
};

}  // namespace

Result<TaskOutput> perplexity(const EvalContext& ctx, const PerplexityOptions& o) {
  const int64_t longest = ctx.engine->max_sequence_tokens();
  const int32_t L = static_cast<int32_t>(o.context > 0 ? o.context : longest);
  if (L < 2 || L > longest)
    return invalid_argument("--context must be within [2, " + std::to_string(longest) +
                            "] (the engine's longest sequence), but it is " + std::to_string(L));
  const int32_t S = o.stride > 0 ? o.stride : L;
  if (S > L) return invalid_argument("--stride (" + std::to_string(S) + ") must not exceed the context (" + std::to_string(L) + ")");
  std::vector<Document> docs;
  if (std::filesystem::is_directory(o.data)) {
    KILN_ASSIGN_OR_RETURN(docs, read_preprocessed_documents(ctx, o.data, o.split));
  } else {
    KILN_ASSIGN_OR_RETURN(docs, read_text_documents(ctx, o.data));
  }
  // Windows: each advances by S; its new tokens [previous end, end) are scored with the context
  // before them in the window (transformers' sliding-window perplexity).
  std::vector<Window> windows;
  int64_t skipped = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const int32_t n = static_cast<int32_t>(docs[d].ids.size());
    if (n < 2) {
      ++skipped;  // nothing to predict
      continue;
    }
    int32_t prev_end = 0;
    for (int32_t begin = 0;; begin += S) {
      const int32_t end = std::min(begin + L, n);
      const int32_t from = std::max(1, prev_end - begin);
      if (from < end - begin) windows.push_back(Window{static_cast<int32_t>(d), begin, end, from});
      prev_end = end;
      if (end == n) break;
    }
  }
  struct DocScore {
    double nll = 0.0;
    int64_t tokens = 0;
  };
  std::vector<DocScore> scores(docs.size());
  int64_t finished_windows = 0;
  Status run = run_requests(
      ctx, static_cast<int64_t>(windows.size()),
      [&](int64_t i) -> Result<GenerationRequest> {
        const Window& w = windows[static_cast<size_t>(i)];
        GenerationRequest r;
        r.prompt.assign(docs[w.doc].ids.begin() + w.begin, docs[w.doc].ids.begin() + w.end);
        r.prompt_logprobs_from = w.from;
        r.max_tokens = 0;
        return r;
      },
      [&](int64_t i, Finished&& f) -> Status {
        const Window& w = windows[static_cast<size_t>(i)];
        const Document& doc = docs[w.doc];
        if (static_cast<int32_t>(f.prompt_logprobs.size()) != w.end - w.begin - w.from)
          return Status(StatusCode::internal, "the engine returned " + std::to_string(f.prompt_logprobs.size()) +
                                                  " prompt log-probabilities for a window of " +
                                                  std::to_string(w.end - w.begin - w.from));
        for (size_t k = 0; k < f.prompt_logprobs.size(); ++k) {
          const size_t t = static_cast<size_t>(w.begin + w.from) + k;
          if (!doc.target.empty() && !doc.target[t]) continue;
          scores[w.doc].nll -= f.prompt_logprobs[k];
          ++scores[w.doc].tokens;
        }
        if (ctx.progress) ctx.progress(++finished_windows, static_cast<int64_t>(windows.size()));
        return Status::Ok();
      });
  KILN_RETURN_IF_ERROR(run);
  TaskOutput out;
  double nll = 0.0;
  int64_t tokens = 0, bytes = 0, scored_docs = 0;
  bool bytes_known = true;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (scores[d].tokens == 0) continue;
    ++scored_docs;
    nll += scores[d].nll;
    tokens += scores[d].tokens;
    bytes_known = bytes_known && docs[d].bytes >= 0;
    bytes += std::max<int64_t>(docs[d].bytes, 0);
    nlohmann::ordered_json item;
    item["line"] = docs[d].line;
    item["tokens"] = scores[d].tokens;
    item["nll"] = scores[d].nll;
    item["perplexity"] = std::exp(scores[d].nll / static_cast<double>(scores[d].tokens));
    out.details.push_back(std::move(item));
  }
  if (tokens == 0) return invalid_argument(o.data + " has no token to score (every document is shorter than two tokens)");
  out.items = scored_docs;
  nlohmann::ordered_json& r = out.results;
  r["documents"] = scored_docs;
  r["skipped_documents"] = skipped;
  r["windows"] = windows.size();
  r["tokens"] = tokens;
  r["nll"] = nll;
  r["mean_nll"] = nll / static_cast<double>(tokens);
  r["perplexity"] = std::exp(nll / static_cast<double>(tokens));
  // Bits per byte of the documents' text (unknown for pre-tokenized data).
  if (bytes_known && bytes > 0)
    r["bits_per_byte"] = nll / std::log(2.0) / static_cast<double>(bytes);
  else
    r["bits_per_byte"] = nullptr;
  r["bytes"] = bytes_known ? nlohmann::ordered_json(bytes) : nlohmann::ordered_json(nullptr);
  r["context"] = L;
  r["stride"] = S;
  return out;
}

}  // namespace kiln::eval
