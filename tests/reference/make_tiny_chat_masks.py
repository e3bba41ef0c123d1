# Reference for kiln preprocess --format chat on testdata/tiny-chat: transformers' token ids and
# assistant masks (apply_chat_template(..., tokenize=True, return_dict=True,
# return_assistant_tokens_mask=True)) for multi-turn conversations with a system prompt, tools and
# tool calls. Writes testdata/chat_masks/tiny_chat_preprocess.json.
# Run: python3 tests/reference/make_tiny_chat_masks.py   (transformers 5.17, tokenizers 0.23, jinja2)
import json, os
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "testdata")
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tiny-chat"))
tool = {"type": "function", "function": {"name": "colour", "description": "The colour of a thing",
        "parameters": {"type": "object", "properties": {"thing": {"type": "string"}}, "required": ["thing"]}}}
convs = [
    {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]},
    {"messages": [{"role": "system", "content": "be small"},
                  {"role": "user", "content": "what is the colour of the sky"},
                  {"role": "assistant", "content": "blue"},
                  {"role": "user", "content": "and the grass"},
                  {"role": "assistant", "content": "green, thanks"}]},
    {"messages": [{"role": "user", "content": "colour of the sea?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "colour", "arguments": {"thing": "sea"}}}]},
                  {"role": "tool", "content": "blue"},
                  {"role": "assistant", "content": "the sea is blue"}],
     "tools": [tool]},
    {"messages": [{"role": "user", "content": "über café 東京 — yes?"}, {"role": "assistant", "content": "no 🐟"}]},
]
cases = []
for c in convs:
    r = tok.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=True, return_dict=True,
                                return_assistant_tokens_mask=True)
    cases.append({"line": c, "input_ids": list(r["input_ids"]), "assistant_masks": list(r["assistant_masks"])})
out = os.path.join(ROOT, "chat_masks", "tiny_chat_preprocess.json")
with open(out, "w") as f:
    json.dump({"made_with": "transformers " + __import__("transformers").__version__, "cases": cases}, f, indent=1,
              ensure_ascii=False)
print("wrote", out, [sum(c["assistant_masks"]) for c in cases])
