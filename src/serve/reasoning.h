// ReasoningSplitter: separates a reasoning model's thinking from its answer in generated text, as
// vLLM's and SGLang's reasoning parsers do for Qwen3, QwQ and DeepSeek-R1: text inside
// <think>...</think> is reasoning, the rest content. The block is open from the start when the
// prompt ends inside it (templates that write "<think>\n" after the generation prompt: DeepSeek-R1,
// Qwen3.5), or when the output begins with "<think>" (Qwen3, which writes it itself); otherwise the
// output is all content (thinking switched off). Output that ends inside the block is reasoning.
// Streaming: text that could still be the start of a tag is held back until the next piece decides,
// so the pieces of every split of a text add up to the whole-text result.
// Thread safety: none; one per choice.
#pragma once

#include <string>
#include <string_view>

namespace kiln::serve {

class ReasoningSplitter {
 public:
  // `prompt_opens_block`: the rendered prompt leaves a <think> block open (see prompt_opens_think).
  explicit ReasoningSplitter(bool prompt_opens_block);

  struct Output {
    std::string reasoning, content;
  };
  Output feed(std::string_view text);
  Output finish();  // whatever was held back

  static constexpr std::string_view kOpen = "<think>";
  static constexpr std::string_view kClose = "</think>";

 private:
  enum class State { start, reasoning, content };
  State state_;
  std::string pending_;  // held back: a possible tag prefix (or, at the start, a possible "<think>")
};

// Whether `prompt` ends inside a <think> block: its last "<think>" stands after its last "</think>".
bool prompt_opens_think(std::string_view prompt);

}  // namespace kiln::serve
