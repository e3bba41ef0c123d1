// Fuzz target (fuzz_common.h): the input is a config.json. Parsing may fail with a Status; a config
// that parses has sizes within the bounds kiln runs (model/config.h), so that nothing sized from it
// can overflow.
#include "fuzz_common.h"
#include "model/config.h"

int kiln::fuzz::config_json(const uint8_t* data, size_t size) {
  Result<ModelConfig> c = load_model_config_file(write_input("config_json", data, size));
  if (!c.ok()) return 0;
  if (c->num_hidden_layers < 1 || c->hidden_size < 1 || c->num_attention_heads < 1 || c->num_key_value_heads < 1 ||
      c->head_dim < 1 || c->vocab_size < 1 || c->intermediate_size < 1 || c->max_position_embeddings < 1)
    invariant_failed("config_json", "a parsed config has a non-positive size");
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    invariant_failed("config_json", "a parsed config's heads are not a multiple of its key/value heads");
  return 0;
}

KILN_FUZZ_ENTRY(config_json)
