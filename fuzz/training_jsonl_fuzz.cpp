// Fuzz target (fuzz_common.h): the input is a training JSONL file, read against a small model's
// config (vocabulary 384, context 256). Reading may fail with a Status naming the line; every
// example read is within the vocabulary and the context, with labels and position ids that match.
#include "fuzz_common.h"
#include "model/config.h"
#include "train/data.h"

int kiln::fuzz::training_jsonl(const uint8_t* data, size_t size) {
  ModelConfig config;
  config.vocab_size = 384;
  config.max_position_embeddings = 256;
  Result<std::vector<TrainExample>> ex = read_training_jsonl(write_input("training_jsonl", data, size), config);
  if (!ex.ok()) return 0;
  for (const TrainExample& e : *ex) {
    if (e.input_ids.empty() || static_cast<int64_t>(e.input_ids.size()) > config.max_position_embeddings)
      invariant_failed("training_jsonl", "an example is empty or longer than the context");
    for (int32_t id : e.input_ids)
      if (id < 0 || id >= config.vocab_size) invariant_failed("training_jsonl", "an input id is outside the vocabulary");
    if (!e.labels.empty() && e.labels.size() != e.input_ids.size())
      invariant_failed("training_jsonl", "labels and input_ids differ in length");
  }
  return 0;
}

KILN_FUZZ_ENTRY(training_jsonl)
