# Makes testdata/tiny-chat/: a model folder for end-to-end tests of preprocess -> train -> generate.
# The weights and config are tiny-llama's (vocab 384); the tokenizer is a byte-level BPE trained here
# with the `tokenizers` library to exactly 384 ids (256 bytes + merges + 3 special tokens), and the
# chat template is ChatML with {% generation %} blocks around assistant turns (as transformers'
# return_assistant_tokens_mask expects). Run: python3 tests/reference/make_tiny_chat.py
# (tokenizers 0.23). The corpus is synthetic and fixed, so the output is reproducible.
import json, os, random, shutil
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "testdata")
OUT = os.path.join(ROOT, "tiny-chat")
os.makedirs(OUT, exist_ok=True)

random.seed(7)
words = ("the a cat dog bird fish red blue green small big runs sits jumps sings swims on in under over "
         "tree house river hill what is colour of sky grass sea hello hi thanks please yes no").split()
corpus = []
for _ in range(4000):
    corpus.append(" ".join(random.choice(words) for _ in range(random.randint(3, 12))))
corpus += ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n"] * 50

specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=specials, show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
assert tok.get_vocab_size() == 384, tok.get_vocab_size()
tok.save(os.path.join(OUT, "tokenizer.json"))

template = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- message['content'] }}"
    "{%- if message.tool_calls is defined %}"
    "{%- for call in message.tool_calls %}"
    "{{- '<tool_call>' + call.function.name + ' ' + (call.function.arguments | tojson) + '</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
with open(os.path.join(OUT, "chat_template.jinja"), "w") as f:
    f.write(template)
with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "model_max_length": 256}, f, indent=2)

cfg = json.load(open(os.path.join(ROOT, "tiny-llama", "config.json")))
cfg["bos_token_id"] = None
cfg["eos_token_id"] = tok.token_to_id("<|im_end|>")
cfg["pad_token_id"] = tok.token_to_id("<|endoftext|>")
with open(os.path.join(OUT, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
shutil.copy(os.path.join(ROOT, "tiny-llama", "model.safetensors"), os.path.join(OUT, "model.safetensors"))
with open(os.path.join(OUT, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}, f, indent=2)
print("wrote", OUT, "ids:", {s: tok.token_to_id(s) for s in specials})
