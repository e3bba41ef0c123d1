// The <think> splitter of kiln serve's reasoning parser (serve/reasoning.h): the split of whole
// outputs, written from vLLM's and SGLang's documented behaviour for Qwen3 / DeepSeek-R1 outputs,
// and that every split of an output into streamed pieces adds up to the same result.
#include <gtest/gtest.h>

#include "serve/reasoning.h"

namespace kiln::serve {
namespace {

struct Split {
  std::string reasoning, content;
  bool operator==(const Split&) const = default;
};

Split whole(bool opened, const std::string& text) {
  ReasoningSplitter s(opened);
  ReasoningSplitter::Output a = s.feed(text), b = s.finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

// Every way of cutting `text` into two or three pieces gives the whole-text split.
void expect_streams_alike(bool opened, const std::string& text) {
  const Split want = whole(opened, text);
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      ReasoningSplitter s(opened);
      Split got;
      for (const std::string& piece : {text.substr(0, i), text.substr(i, j - i), text.substr(j)}) {
        ReasoningSplitter::Output o = s.feed(piece);
        got.reasoning += o.reasoning;
        got.content += o.content;
      }
      ReasoningSplitter::Output o = s.finish();
      got.reasoning += o.reasoning;
      got.content += o.content;
      ASSERT_EQ(got, want) << "cut at " << i << ", " << j << " of " << text;
    }
}

TEST(ReasoningSplitter, SplitsWholeOutputs) {
  // Qwen3: the model writes the block itself.
  EXPECT_EQ(whole(false, "<think>\nLet me see.\n</think>\n\nIt is 4."), (Split{"\nLet me see.\n", "\n\nIt is 4."}));
  // Thinking switched off (the template closed an empty block in the prompt): all content.
  EXPECT_EQ(whole(false, "It is 4."), (Split{"", "It is 4."}));
  EXPECT_EQ(whole(false, "A <think> inside is text"), (Split{"", "A <think> inside is text"}));
  // DeepSeek-R1 / Qwen3.5: the prompt opened the block, the output only closes it.
  EXPECT_EQ(whole(true, "Hmm.</think>It is 4."), (Split{"Hmm.", "It is 4."}));
  // Cut off while thinking (max_tokens): all reasoning.
  EXPECT_EQ(whole(true, "Hmm, so"), (Split{"Hmm, so", ""}));
  EXPECT_EQ(whole(false, "<think>Hmm, so </thi"), (Split{"Hmm, so </thi", ""}));
  // Only the first close ends the block; a later one is content, as is an unfinished tag at the start.
  EXPECT_EQ(whole(true, "a</think>b</think>c"), (Split{"a", "b</think>c"}));
  EXPECT_EQ(whole(false, "<thin"), (Split{"", "<thin"}));
  EXPECT_EQ(whole(false, ""), (Split{"", ""}));
  EXPECT_EQ(whole(true, "</think>"), (Split{"", ""}));
}

TEST(ReasoningSplitter, StreamedPiecesAddUpToTheWhole) {
  for (const char* text : {"<think>\nLet me see.\n</think>\n\nIt is 4.", "It is 4.", "<thin", "<think>a</th",
                           "<think></think>", "x</think>y</think>z", "<<think>>", "</thinking> </think>!"})
    for (bool opened : {false, true}) expect_streams_alike(opened, text);
}

TEST(ReasoningSplitter, PromptOpensThink) {
  EXPECT_TRUE(prompt_opens_think("<|User|>hi<|Assistant|><think>\n"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_think("<think>a</think> then <think>"));
}

}  // namespace
}  // namespace kiln::serve
