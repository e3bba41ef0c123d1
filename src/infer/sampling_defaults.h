// SamplingDefaults: the sampling parameters a model's creator recommends, from the model folder's
// generation_config.json (temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens),
// used where a request leaves them out: what vLLM does with --generation-config auto, its
// default. Requests that give a field keep theirs.
// Ownership: plain values. Thread safety: none needed (immutable after loading).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "infer/engine.h"

namespace kiln {

struct SamplingDefaults {
  std::optional<float> temperature;         // >= 0
  std::optional<int32_t> top_k;             // >= 0 (0: off)
  std::optional<float> top_p;               // (0, 1]
  std::optional<float> min_p;               // [0, 1]
  std::optional<float> repetition_penalty;  // > 0
  std::optional<int32_t> max_tokens;        // max_new_tokens, >= 1
  std::string source;                       // the file they came from ("" when none)

  bool empty() const;
  // "temperature 0.6, top_k 20, top_p 0.95": the fields present, for a log line.
  std::string describe() const;
  // Sets the sampling fields present (not max_tokens: each caller bounds its own length).
  void apply(GenerationRequest* request) const;
};

// The defaults of <model_dir>/generation_config.json: empty when the file does not exist or holds
// none of the fields (null means absent, as transformers writes it); an error naming the file and
// the field for a value of the wrong type or out of range.
Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir);

}  // namespace kiln
