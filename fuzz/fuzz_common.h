// Shared pieces of kiln's fuzz targets (fuzz/*_fuzz.cpp). Each target is a function
// kiln::fuzz::<name>(data, size) that feeds one input to one of kiln's parsers of outside data; it
// may reject the input (a Status) but must not crash, hang, leak or trip a sanitizer, and aborts
// where an invariant the parser promises does not hold. Built two ways: with clang and libFuzzer
// (scripts/fuzz.sh, -DKILN_LIBFUZZER: each file then defines LLVMFuzzerTestOneInput), and into the
// CPU test suite, which replays the committed corpora (fuzz/corpus/<name>/) through every target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::fuzz {

int tokenizer_encode(const uint8_t* data, size_t size);
int tokenizer_json(const uint8_t* data, size_t size);
int config_json(const uint8_t* data, size_t size);
int safetensors_header(const uint8_t* data, size_t size);
int chat_template(const uint8_t* data, size_t size);
int training_jsonl(const uint8_t* data, size_t size);
int regex_pattern(const uint8_t* data, size_t size);
int kiln_shard(const uint8_t* data, size_t size);
int serve_request(const uint8_t* data, size_t size);

// Writes the input to a file of this process (one per target) and returns its path, for parsers
// that read files.
std::string write_input(const char* target, const uint8_t* data, size_t size);
// Aborts with a message: an invariant of the parser under test does not hold.
[[noreturn]] void invariant_failed(const char* target, const std::string& what);

}  // namespace kiln::fuzz

#ifdef KILN_LIBFUZZER
#define KILN_FUZZ_ENTRY(fn) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln::fuzz::fn(data, size); }
#else
#define KILN_FUZZ_ENTRY(fn)
#endif
