# Makes testdata/tiny-tools/: a tiny LlamaForCausalLM whose weights are constructed (not trained) so
# that its greedy output is known by construction, tool calls included; the fixture of the
# `kiln serve` tests. Run from anywhere: python3 tests/reference/make_tool_model.py (CPU torch,
# transformers 5.17, tokenizers 0.23, safetensors, numpy; a few seconds; no randomness, so the
# output is identical from run to run). The script asserts every designed reply against
# transformers' own greedy `generate` (fp32 and bf16) and writes the results to golden.json.
#
# The model is a "bigram with context switches": one layer; every token that occurs as the current
# token of a reply chain owns a one-hot embedding dimension (all other tokens share an "other"
# dimension, the markers <tools> and <tool_response> own one each). Attention head 0 has the same
# query for every token in the slowest rotary pair (7, 15), so RoPE barely matters, and keys only on
# the markers (score 20 for <tools>, 40 for <tool_response>, 0 otherwise); their values land in two
# feature dimensions f1 (tools given) and f2 (a tool result is in the context). The other heads and
# the MLP write nothing. lm_head scores next tokens as A[next, current] + B[next, feature]: the
# chain successor gets +10; after the generation prompt's "\n" the greeting gets 10 and the tool
# call and weather reply 7, plus 6 under their feature, so the feature picks the reply and the
# chains then run to <|im_end|> whatever the feature (10 beats 6).
import json, os, re, shutil
import numpy as np, torch, tokenizers, transformers
from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(ROOT, "testdata", "tiny-tools")
TEMPLATE = os.path.join(ROOT, "testdata", "chat_templates", "more", "qwen2.5-tools.jinja")

# ---------------------------------------------------------------- tokenizer
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP = ["<tools>", "</tools>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CALL = ['\n{"name": "get_weather", "arguments":', ' {"city": ', '"Paris"', '}}\n']
WORDS = ["Hello", " How", " can", " I", " help", " you", " today", "The", " weather", " in", " Paris",
         " is", " sunny", " time", " there", " was", " a", " little", " dragon"]
# The replies, as token strings (single characters are byte tokens); each ends with <|im_end|>.
GREETING = ["Hello", "!", " How", " can", " I", " help", " you", " today", "?"]
TOOL_CALL = ["<tool_call>"] + CALL + ["</tool_call>"]
WEATHER = ["The", " weather", " in", " Paris", " is", " sunny", "."]
STORY = [" there", " was", " a", " little", " dragon", "."]


def bytes_to_unicode():  # GPT-2's byte -> printable character map (the ByteLevel alphabet)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
tok = Tokenizer(models.BPE(vocab={B2U[b]: b for b in range(256)}, merges=[]))  # id of byte b == b
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.decoder = decoders.ByteLevel()
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in MARKUP + CALL + WORDS])
V = tok.get_vocab_size()


def tid(s):
    ids = tok.encode(s, add_special_tokens=False).ids
    assert len(ids) == 1, (s, ids)
    return ids[0]


EOS, PAD = tid("<|im_end|>"), tid("<|endoftext|>")

# ---------------------------------------------------------------- weights
chains = {"\n": None}  # current token -> its chain successor ("\n" is special-cased below)
for chain in (GREETING, TOOL_CALL, WEATHER, [" time"] + STORY):
    for cur, nxt in zip(chain, chain[1:] + ["<|im_end|>"]):
        assert chains.get(cur, nxt) == nxt, cur  # every current token has one successor
        chains[cur] = nxt
dim = {tid(c): i for i, c in enumerate(chains)}  # one-hot dimension of each current token
OTHER, TOOLS, RESP, F1, F2 = range(len(dim), len(dim) + 5)
assert F2 < 64
dim[tid("<tools>")], dim[tid("<tool_response>")] = TOOLS, RESP

H, HD = 64, 16
emb = np.zeros((V, H), np.float32)
for t in range(V):
    emb[t, dim.get(t, OTHER)] = 1.0  # after input_layernorm every token is 8 * one-hot
q = np.zeros((4 * HD, H), np.float32); q[7, :] = 1.0  # head 0, dim 7: q = 8 for every token
k = np.zeros((2 * HD, H), np.float32)
k[7, TOOLS], k[7, RESP] = 10 / 8, 20 / 8  # k = 10 / 20: score q.k / sqrt(16) = 20 / 40
v = np.zeros((2 * HD, H), np.float32); v[0, TOOLS] = v[1, RESP] = 1 / 8  # v = 1 in value dim 0 / 1
o = np.zeros((H, 4 * HD), np.float32); o[F1, 0] = o[F2, 1] = 1.0  # head 0 value dims -> f1, f2

A = np.zeros((V, H), np.float32)  # lm_head before scaling: A on current dims, B on feature dims
for cur, nxt in chains.items():
    if cur != "\n":
        A[tid(nxt), dim[tid(cur)]] = 10
A[EOS, OTHER] = A[EOS, TOOLS] = A[EOS, RESP] = 10  # anything else: end the turn
A[tid(GREETING[0]), dim[tid("\n")]] = 10
A[tid(TOOL_CALL[0]), dim[tid("\n")]] = A[tid(WEATHER[0]), dim[tid("\n")]] = 7
A[tid(TOOL_CALL[0]), F1] = A[tid(WEATHER[0]), F2] = 6
# The final norm makes the hidden state 8 * e_cur (no feature) or 5.66 * (e_cur + e_f): with the
# scale 1/4 the logits are 2 * (A) or 1.41 * (A + B).
LM_SCALE = 0.25
state = {
    "model.embed_tokens.weight": emb,
    "model.layers.0.self_attn.q_proj.weight": q, "model.layers.0.self_attn.k_proj.weight": k,
    "model.layers.0.self_attn.v_proj.weight": v, "model.layers.0.self_attn.o_proj.weight": o,
    "model.layers.0.mlp.gate_proj.weight": np.zeros((64, H), np.float32),
    "model.layers.0.mlp.up_proj.weight": np.zeros((64, H), np.float32),
    "model.layers.0.mlp.down_proj.weight": np.zeros((H, 64), np.float32),
    "model.layers.0.input_layernorm.weight": np.ones(H, np.float32),
    "model.layers.0.post_attention_layernorm.weight": np.ones(H, np.float32),
    "model.norm.weight": np.ones(H, np.float32),
    "lm_head.weight": A * LM_SCALE,
}

config = LlamaConfig(
    vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=HD, hidden_act="silu", max_position_embeddings=4096,
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e7},
    tie_word_embeddings=False, bos_token_id=None, eos_token_id=EOS, pad_token_id=PAD)
model = LlamaForCausalLM(config)
model.load_state_dict({n: torch.from_numpy(a) for n, a in state.items()}, strict=True)

# ---------------------------------------------------------------- write the folder
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=EOS, pad_token_id=PAD)
model.save_pretrained(OUT, safe_serialization=True)
tok.save(os.path.join(OUT, "tokenizer.json"))
shutil.copy(TEMPLATE, os.path.join(OUT, "chat_template.jinja"))
with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
    json.dump({"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "bos_token": None,
               "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "clean_up_tokenization_spaces": False, "model_max_length": 4096}, f, indent=2)
    f.write("\n")

# ---------------------------------------------------------------- check with transformers, goldens
hf_tok = AutoTokenizer.from_pretrained(OUT)
hf = {dt: AutoModelForCausalLM.from_pretrained(OUT, dtype=dt, attn_implementation="eager").eval()
      for dt in (torch.float32, torch.bfloat16)}
assert hf_tok.eos_token_id == EOS and hf_tok.pad_token_id == PAD and hf_tok.bos_token is None
assert hf[torch.float32].generation_config.eos_token_id == EOS

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name."}},
                   "required": ["city"]}}}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALL_MSG = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 22, "condition": "sunny"}'}
HI = [{"role": "user", "content": "Hi!"}]
# (name, messages or None, tools, prompt text (completion) or forced prefix (chat), expected tokens)
CASES = [
    ("chat", HI, None, "", GREETING),
    ("chat_system", [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Hello"}],
     None, "", GREETING),
    ("chat_multi_turn", HI + [{"role": "assistant", "content": "Hello! How can I help you today?"},
                              {"role": "user", "content": "Tell me a story."}], None, "", GREETING),
    ("tools", [ASK], [WEATHER_TOOL], "", TOOL_CALL),
    ("tools_system", [{"role": "system", "content": "You are a weather bot."}, ASK], [WEATHER_TOOL], "", TOOL_CALL),
    ("tool_result", [ASK, CALL_MSG, RESULT], [WEATHER_TOOL], "", WEATHER),
    ("tool_result_no_tools", [ASK, CALL_MSG, RESULT], None, "", WEATHER),
    ("completion", None, None, "Once upon a time", STORY),
    ("forced_greeting", HI, None, "Hello!", GREETING[2:]),
    ("forced_weather", HI, None, "The weather", WEATHER[2:]),
    ("forced_call_open", HI, None, "<tool_call>", TOOL_CALL[1:]),
    ("forced_call_name", [ASK], [WEATHER_TOOL], "<tool_call>" + CALL[0], TOOL_CALL[2:]),
]


@torch.no_grad()
def greedy(m, ids):
    out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                     do_sample=False, max_new_tokens=40)
    return out[0, len(ids):].tolist()


golden_cases, worst = [], (1e9, 1.0)
for name, messages, tools, text, expect in CASES:
    rendered = text
    if messages is not None:
        rendered = hf_tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        rendered += text  # the forced prefix of the assistant's reply
    ids = hf_tok(rendered, add_special_tokens=False)["input_ids"]
    want = [tid(s) for s in expect] + [EOS]
    got = greedy(hf[torch.float32], ids)
    assert got == want, (name, got, want, hf_tok.decode(got))
    assert greedy(hf[torch.bfloat16], ids) == want, (name, "bf16")
    with torch.no_grad():  # margins: logits of the last prompt position and each new one but the last
        logits = hf[torch.float32](torch.tensor([ids + got[:-1]])).logits[0, len(ids) - 1:].double()
    top2 = logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(got)[:, None])[:, 0]
    worst = (min(worst[0], margin), min(worst[1], logprobs.exp().min().item()))
    case = {"name": name}
    case.update({"messages": messages, "tools": tools, "prefix": text} if messages is not None else {"prompt": text})
    case.update({
        "rendered": rendered, "prompt_ids": ids, "prompt_tokens": len(ids),
        "completion_ids": got, "completion_text": hf_tok.decode(got, skip_special_tokens=True),
        "completion_tokens": len(got), "finish_token_id": got[-1], "finish_reason": "stop",
        "token_logprobs": [float(f"{x:.7g}") for x in logprobs.tolist()], "min_margin": round(margin, 4)})
    assert case["completion_text"] == "".join(expect), case["completion_text"]
    golden_cases.append(case)
    print(f"{name:22s} prompt {len(ids):4d} tokens -> {case['completion_text']!r}  "
          f"(min logit margin {margin:.2f}, min p {logprobs.exp().min().item():.4f})")

# The tokenizer must round-trip the replies (serve re-renders earlier assistant turns).
for reply in (GREETING, TOOL_CALL, WEATHER, STORY):
    assert hf_tok("".join(reply), add_special_tokens=False)["input_ids"] == [tid(s) for s in reply], reply

important = SPECIAL + MARKUP + CALL + WORDS + ["\n", "!", "?", "."]
golden = {
    "about": "constructed tiny model with known greedy replies; made by tests/reference/make_tool_model.py",
    "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                 "tokenizers": tokenizers.__version__},
    "vocab_size": V, "eos_token_id": EOS, "pad_token_id": PAD,
    "tokens": {s: tid(s) for s in important},
    "replies": {"greeting": "".join(GREETING), "tool_call": "".join(TOOL_CALL), "weather": "".join(WEATHER),
                "story": "".join(STORY)},
    "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}},
    "max_new_tokens": 40,
    "cases": golden_cases,
}
text = json.dumps(golden, indent=1, ensure_ascii=False)
text = re.sub(r"\[[-0-9.,\s]+\]", lambda m: json.dumps(json.loads(m.group(0))), text)  # number lists: one line
with open(os.path.join(OUT, "golden.json"), "w") as f:
    f.write(text + "\n")
print(f"wrote {OUT}: vocab {V}, eos {EOS}, pad {PAD}; smallest logit margin {worst[0]:.2f}, "
      f"smallest top-1 probability {worst[1]:.4f}")
