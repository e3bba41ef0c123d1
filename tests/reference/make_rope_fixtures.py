#!/usr/bin/env python3
"""YaRN RoPE references from transformers (5.17, torch CPU, fp32):

- testdata/rope/cases.json: config.json objects with rope scaling (yarn in the transformers-5
  `rope_parameters` layout and the transformers-4 `rope_scaling` layout with "type" or
  "rope_type"; optional keys beta_fast, beta_slow, truncate, mscale, mscale_all_dim,
  attention_factor; a null factor; original_max_position_embeddings absent, in the rope object,
  or at the top level; llama3 without original_max_position_embeddings), each with the inverse
  frequencies and attention factor transformers computes for it (ROPE_INIT_FUNCTIONS).
- testdata/tiny-qwen3-yarn/: a random Qwen3 checkpoint with YaRN (factor 4 over 64 pretraining
  positions, max_position_embeddings 64) and golden.safetensors in the format of
  make_model_fixtures.py, whose seq_a is 150 tokens: past the pretraining context, within the
  extended one; train_golden.safetensors: a 2 x 120 training batch (row 1's first 6 labels masked)
  with its loss, every gradient, the parameters after one AdamW step (lr 1e-2, betas (0.9, 0.95),
  eps 1e-8, weight decay 0.1) and the loss after it, as tests/reference/make_train_fixtures.py makes
  them.

Run on a machine with torch and transformers (the CPU machine's venv works):
  python3 tests/reference/make_rope_fixtures.py
"""
import copy
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "testdata")


def base(head_dim, theta, max_pos, model_type="qwen2"):
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[model_type]
    return {"architectures": [arch], "model_type": model_type, "vocab_size": 128, "hidden_size": 4 * head_dim,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": head_dim, "max_position_embeddings": max_pos, "rope_theta": theta}


def v5(cfg, params):  # transformers 5: rope_theta inside rope_parameters
    c = dict(cfg)
    p = dict(params)
    p["rope_theta"] = c.pop("rope_theta")
    c["rope_parameters"] = p
    return c


def v4(cfg, params, type_key="type"):  # transformers 4: top-level rope_theta, rope_scaling
    c = dict(cfg)
    p = dict(params)
    p[type_key] = p.pop("rope_type")
    c["rope_scaling"] = p
    return c


YARN = {"rope_type": "yarn"}
CASES = [
    ("qwen3 recommended long context (rope_scaling, type)",
     v4(base(128, 1000000.0, 40960, "qwen3"), dict(YARN, factor=4.0, original_max_position_embeddings=32768))),
    ("qwen2.5 recommended long context (rope_scaling, rope_type)",
     v4(base(128, 1000000.0, 32768), dict(YARN, factor=4.0, original_max_position_embeddings=32768), "rope_type")),
    ("rope_parameters, head_dim 64, theta 1e4, factor 8",
     v5(base(64, 10000.0, 32768, "llama"), dict(YARN, factor=8.0, original_max_position_embeddings=4096))),
    ("beta_fast, beta_slow, truncate false",
     v5(base(64, 10000.0, 16384), dict(YARN, factor=8.0, original_max_position_embeddings=2048, beta_fast=16,
                                       beta_slow=2.0, truncate=False))),
    ("mscale equal to mscale_all_dim",
     v5(base(64, 10000.0, 163840, "llama"), dict(YARN, factor=40.0, original_max_position_embeddings=4096, mscale=1.0,
                                                 mscale_all_dim=1.0))),
    ("mscale and mscale_all_dim different",
     v5(base(128, 500000.0, 65536, "llama"), dict(YARN, factor=16.0, original_max_position_embeddings=4096,
                                                  mscale=0.707, mscale_all_dim=1.0))),
    ("explicit attention_factor",
     v5(base(64, 1000000.0, 131072), dict(YARN, factor=4.0, original_max_position_embeddings=32768,
                                          attention_factor=1.25))),
    ("factor null: max_position_embeddings / original",
     v5(base(64, 10000.0, 16384, "llama"), dict(YARN, factor=None, original_max_position_embeddings=4096))),
    ("original_max_position_embeddings absent: max_position_embeddings",
     v5(base(64, 10000.0, 8192), dict(YARN, factor=2.0))),
    ("original_max_position_embeddings at the top level",
     dict(v5(base(64, 10000.0, 8192), dict(YARN, factor=2.0, original_max_position_embeddings=1024)),
          original_max_position_embeddings=2048)),
    ("head_dim 16, theta 1e6: the ramp's ends meet",
     v5(base(16, 1000000.0, 256), dict(YARN, factor=4.0, original_max_position_embeddings=64))),
    ("head_dim 32, factor 1.5, theta 1e4",
     v4(base(32, 10000.0, 512, "qwen3"), dict(YARN, factor=1.5, original_max_position_embeddings=256))),
    ("llama3 without original_max_position_embeddings",
     v5(base(64, 500000.0, 8192, "llama"), {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0})),
]


def rope_cases():
    out = []
    for name, cfg in CASES:
        conf = AutoConfig.for_model(**copy.deepcopy(cfg))  # transformers edits the rope dict in place
        conf.standardize_rope_params()
        rope_type = conf.rope_parameters["rope_type"]
        inv, attention = ROPE_INIT_FUNCTIONS[rope_type](conf, "cpu")
        assert inv.dtype == torch.float32
        out.append({"name": name, "config": cfg, "inv_freq": [float(x) for x in inv.tolist()],
                    "attention_factor": float(attention)})
        print(f"{name}: attention_factor {float(attention):.9g}, inv_freq[:4] {inv[:4].tolist()}")
    os.makedirs(os.path.join(DATA, "rope"), exist_ok=True)
    with open(os.path.join(DATA, "rope", "cases.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": out}, f, indent=1)


def randomize(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n: p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else: p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5))


def tiny_model():
    torch.manual_seed(2026)
    cfg = Qwen3Config(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                      rms_norm_eps=1e-5, attn_implementation="eager", bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=True,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 64})
    m = Qwen3ForCausalLM(cfg).float().eval()
    randomize(m)
    d = os.path.join(DATA, "tiny-qwen3-yarn")
    os.makedirs(d, exist_ok=True)
    m.save_pretrained(d, safe_serialization=True)
    gen = os.path.join(d, "generation_config.json")
    if os.path.exists(gen): os.remove(gen)
    g = {}
    a = torch.randint(3, cfg.vocab_size, (1, 150))
    b = torch.randint(3, cfg.vocab_size, (1, 9))
    with torch.no_grad():
        g["seq_a.input_ids"] = a[0].int(); g["seq_a.logits"] = m(a).logits[0].float()
        g["seq_b.input_ids"] = b[0].int(); g["seq_b.logits"] = m(b).logits[0].float()
        out = m.generate(b, max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        g["greedy.new_tokens"] = out[0, b.shape[1]:].int(); g["greedy.full_logits"] = m(out).logits[0].float()
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(d, "golden.safetensors"))
    json.dump({"model": "tiny-qwen3-yarn", "transformers": transformers.__version__, "torch": torch.__version__,
               "stored_dtype": "torch.float32", "sharded": False,
               "note": "YaRN factor 4 over 64 pretraining positions; seq_a is 150 tokens"},
              open(os.path.join(d, "golden.json"), "w"), indent=1)
    train_golden(d)
    print("tiny-qwen3-yarn", sorted(os.listdir(d)))


def train_golden(d):
    torch.manual_seed(777)
    m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").float()
    m.train(); m.zero_grad()
    g = {}
    ids = torch.randint(3, m.config.vocab_size, (2, 120)); labels = ids.clone(); labels[1, :6] = -100
    loss = m(ids, labels=labels).loss; loss.backward()
    g["train.input_ids"] = ids.int(); g["train.labels"] = labels.int(); g["train.loss"] = loss.detach().reshape(1)
    g.update({"grad." + n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None})
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1); opt.step()
    for n, p in m.named_parameters(): g["adamw_step1." + n] = p.detach().clone()
    with torch.no_grad(): g["train.loss_after_step1"] = m(ids, labels=labels).loss.reshape(1)
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(d, "train_golden.safetensors"))


if __name__ == "__main__":
    torch.set_num_threads(2)
    rope_cases()
    tiny_model()
