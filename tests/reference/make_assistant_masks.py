#!/usr/bin/env python3
"""Makes testdata/chat_masks/assistant_masks.json: transformers' apply_chat_template(...,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True) over several conversations
(system prompts, several turns, tools, tool calls and results, unicode, empty and space-led
content) with a template that has {% generation %} blocks
(testdata/chat_templates/qwen2.5-tools-generation.jinja) and two fixture tokenizers (byte-level BPE
with <|im_start|>/<|im_end|> added tokens; SentencePiece-style BPE with a Prepend/Replace normalizer
and byte fallback). Each case keeps the rendered text, transformers' generation spans (characters),
input_ids and assistant_masks. The same conversations rendered with the template without generation
blocks (testdata/chat_templates/more/qwen2.5-tools.jinja) give the same text (checked here), so
tests/cpu/test_chat_tokens.cpp can check kiln's prefix method against the same masks.

Run: /tmp/tokvenv/bin/python tests/reference/make_assistant_masks.py   (transformers 5.17, tokenizers 0.23.3)
"""
import json
import os

import jinja2
import tokenizers
import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "testdata")
OUT = os.path.join(DATA, "chat_masks", "assistant_masks.json")
GEN_TEMPLATE = "chat_templates/qwen2.5-tools-generation.jinja"
PLAIN_TEMPLATE = "chat_templates/more/qwen2.5-tools.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time in a time zone",
                 "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}},
}


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = [
    ("system_two_turns", None, [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Japan?"},
        {"role": "assistant", "content": "Tokyo is the capital of Japan."},
    ]),
    ("default_system", None, [
        {"role": "user", "content": "Write a haiku about rain."},
        {"role": "assistant", "content": "Soft rain on the roof\nwhispers to the sleeping town\npuddles hold the sky\n"},
    ]),
    ("tool_call_and_result", [WEATHER], [
        {"role": "system", "content": "You help with the weather."},
        {"role": "user", "content": "Is it cold in Zürich today?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich", "unit": "c"})]},
        {"role": "tool", "content": "{\"temperature\": -3, \"sky\": \"snow\"}"},
        {"role": "assistant", "content": "Yes: -3 °C with snow in Zürich. Wear a warm coat!"},
    ]),
    ("two_calls_with_content", [WEATHER, TIME], [
        {"role": "user", "content": "Weather and time in Tokyo, please."},
        {"role": "assistant", "content": "Let me check both.",
         "tool_calls": [call("get_weather", {"city": "Tokyo"}), call("get_time", {"tz": "Asia/Tokyo"})]},
        {"role": "tool", "content": "{\"temperature\": 18}"},
        {"role": "tool", "content": "{\"time\": \"21:04\"}"},
        {"role": "assistant", "content": "In Tokyo it is 18 °C and 21:04."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ]),
    ("unicode", None, [
        {"role": "system", "content": "Réponds en français, s'il te plaît. 🙂"},
        {"role": "user", "content": "日本語で「ありがとう」は？ And Ελληνικά?"},
        {"role": "assistant", "content": "「ありがとう」 means thank you; in Greek: ευχαριστώ 🙏🏽."},
        {"role": "user", "content": "Emoji family: 👨\u200d👩\u200d👧"},
        {"role": "assistant", "content": "  Two leading spaces, then 👍 and e\u0301 (combining)."},
    ]),
    ("empty_and_consecutive", None, [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Now say something."},
        {"role": "user", "content": "Anything at all."},
        {"role": "assistant", "content": "Something."},
    ]),
]

TOKENIZERS = [
    ("chat_templates/models/qwen2.5-instruct", "<|begin_of_text|>", "<|end_of_text|>"),
    ("tokenizers/sentencepiece-bpe.tokenizer.json", "<s>", "</s>"),
]


def load_tokenizer(rel):
    path = os.path.join(DATA, rel)
    if os.path.isdir(path):
        return AutoTokenizer.from_pretrained(path)
    return PreTrainedTokenizerFast(tokenizer_file=path, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def main():
    with open(os.path.join(DATA, GEN_TEMPLATE), encoding="utf-8") as f:
        gen_template = f.read()
    with open(os.path.join(DATA, PLAIN_TEMPLATE), encoding="utf-8") as f:
        plain_template = f.read()
    cases = []
    for tok_rel, bos, eos in TOKENIZERS:
        tok = load_tokenizer(tok_rel)
        for name, tools, messages in CONVERSATIONS:
            out = tok.apply_chat_template(messages, tools=tools, chat_template=gen_template, tokenize=True,
                                          return_dict=True, return_assistant_tokens_mask=True,
                                          bos_token=bos, eos_token=eos)
            rendered, spans = render_jinja_template(conversations=[messages], tools=tools, chat_template=gen_template,
                                                    return_assistant_tokens_mask=True, bos_token=bos, eos_token=eos)
            plain = tok.apply_chat_template(messages, tools=tools, chat_template=plain_template, tokenize=False,
                                            bos_token=bos, eos_token=eos)
            assert plain == rendered[0], (name, plain, rendered[0])
            ids = list(out["input_ids"])
            mask = list(out["assistant_masks"])
            assert len(ids) == len(mask) and sum(mask) > 0, name
            cases.append({
                "name": f"{os.path.basename(tok_rel).split('.')[0]}/{name}",
                "tokenizer": tok_rel + ("/tokenizer.json" if os.path.isdir(os.path.join(DATA, tok_rel)) else ""),
                "template": GEN_TEMPLATE,
                "plain_template": PLAIN_TEMPLATE,
                "inputs": {"messages": messages, "tools": tools, "add_generation_prompt": False,
                           "bos_token": bos, "eos_token": eos},
                "text": rendered[0],
                "generation_spans": [list(s) for s in spans[0]],  # characters of text
                "input_ids": ids,
                "assistant_masks": mask,
            })
    with open(OUT, "w", encoding="utf-8") as f:  # one case a line
        head = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
