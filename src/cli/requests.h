// kiln generate --requests: a JSONL file of requests through the engine (cli/requests.cpp).
#pragma once

#include <string>

#include "cli/engine_flags.h"

namespace kiln::cli {

struct RequestsFlags {
  std::string requests;            // the JSONL file
  std::string output;              // results file; stdout when empty
  int32_t default_max_tokens = 16; // for lines without max_tokens
};

int run_requests(const ModelFlags& model_flags, const EngineFlags& engine_flags, const RequestsFlags& flags);

}  // namespace kiln::cli
