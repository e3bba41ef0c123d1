# The Muon reference for tests/cpu/test_muon.cpp and tests/gpu/test_muon_gpu.cpp: two optimizer
# steps of torch.optim.Muon on the transformer blocks' weight matrices plus torch.optim.AdamW
# (foreach=False) on everything else, from stored weights and gradients, CPU math.
#
# Run from the repository root in a venv with CPU torch (>= 2.9, which has torch.optim.Muon),
# safetensors and numpy:
#   python3 tests/reference/make_muon_fixture.py
# Writes testdata/muon/config.json (a Llama smaller than tiny-llama, so the fixture stays small:
# hidden 32, 4 q heads / 2 kv heads of 8, intermediate 80, 2 layers, vocab 64, untied lm_head: q
# and o are square, k and v are wide, gate and up tall, down wide) and testdata/muon/muon.safetensors:
#   init.<hf name>                 the weights before step 1 (N(0, 0.02^2); norms 1 + N(0, 0.1^2))
#   grad1.<hf name>, grad2.<hf name>   the gradients of steps 1 and 2 (N(0, s^2), s per tensor)
#   <case>.<hf name>               the weights after both steps, for each case below
#   <case>.momentum.<hf name>      torch's Muon momentum_buffer after both steps (block matrices;
#                                  cases original and plain_momentum)
# and in the header's __metadata__: "torch" (the version that made it), "cases" (JSON: every case's
# options) and "no_decay" (the expression; Python's re.search and ECMAScript agree on it).
#
# Cases: lr 0.02, weight decay 0.1, AdamW betas (0.9, 0.95), eps 1e-8, Muon momentum 0.95,
# Nesterov, 5 Newton-Schulz steps unless said otherwise:
#   original           adjust_lr "original", gradients clipped to global norm 1 (clip_grad_norm_)
#   match_rms_adamw    adjust_lr "match_rms_adamw", no clipping
#   plain_momentum     momentum 0.9 without Nesterov, adjust_lr "original", 3 Newton-Schulz steps
#   original_bf16      "original" with torch's own bf16 Newton-Schulz (the CUDA twin's arithmetic)
# The f32 cases run torch's real Muon code with one change: the bf16 cast inside
# torch.optim._muon._zeropower_via_newtonschulz (grad.to(dtype=torch.bfloat16, copy=True)) made an
# f32 copy, by giving that module a `torch` whose `bfloat16` is torch.float32. The script checks
# that the cast was reached (so a torch that casts some other way fails here instead of silently
# producing bf16 results), and that the bf16 case differs from the f32 one.
import json
import os
import re

import numpy as np
import torch
import torch.optim._muon as muon_module
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT_DIR = os.path.join(ROOT, "testdata", "muon")
NO_DECAY = r"norm|\.bias$|embed_tokens|layers\.1\.self_attn\.o_proj"

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "dtype": "float32", "head_dim": 8,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 80,
    "max_position_embeddings": 64, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
    "use_cache": True, "vocab_size": 64,
}

BASE = {"lr": 0.02, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8, "momentum": 0.95, "nesterov": True,
        "ns_steps": 5, "adjust_lr": "original", "clip_norm": 0.0, "bf16": False}
CASES = {
    "original": dict(BASE, clip_norm=1.0),
    "match_rms_adamw": dict(BASE, adjust_lr="match_rms_adamw"),
    "plain_momentum": dict(BASE, momentum=0.9, nesterov=False, ns_steps=3),
    "original_bf16": dict(BASE, clip_norm=1.0, bf16=True),
}


# The cases whose momentum buffers are stored (the others' equal one of these or add little).
MOMENTUM_CASES = ("original", "plain_momentum")


def hf_tensors(c):
    H, V, I, D = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "self_attn.q_proj.weight", (q, H)),
                (p + "self_attn.k_proj.weight", (kv, H)), (p + "self_attn.v_proj.weight", (kv, H)),
                (p + "self_attn.o_proj.weight", (H, q)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I))]
    out += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return out


def is_block_matrix(name):
    return re.search(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$", name)


class _F32Torch:
    """torch, except that torch.bfloat16 is torch.float32 (for _muon's module global only)."""

    def __init__(self):
        self.casts = 0

    def __getattr__(self, name):
        if name == "bfloat16":
            self.casts += 1
            return torch.float32
        return getattr(torch, name)


def run_case(case, shapes, init, grads):
    params = {n: torch.nn.Parameter(torch.from_numpy(init[n].copy())) for n, _ in shapes}
    decayed = lambda n: re.search(NO_DECAY, n) is None
    muon_names = [n for n, _ in shapes if is_block_matrix(n)]
    other_names = [n for n, _ in shapes if not is_block_matrix(n)]
    wd = case["weight_decay"]
    muon_groups = [{"params": [params[n] for n in muon_names if decayed(n)], "weight_decay": wd},
                   {"params": [params[n] for n in muon_names if not decayed(n)], "weight_decay": 0.0}]
    adam_groups = [{"params": [params[n] for n in other_names if decayed(n)], "weight_decay": wd},
                   {"params": [params[n] for n in other_names if not decayed(n)], "weight_decay": 0.0}]
    muon = torch.optim.Muon([g for g in muon_groups if g["params"]], lr=case["lr"], momentum=case["momentum"],
                            nesterov=case["nesterov"], ns_steps=case["ns_steps"], adjust_lr_fn=case["adjust_lr"])
    adamw = torch.optim.AdamW([g for g in adam_groups if g["params"]], lr=case["lr"], betas=tuple(case["betas"]),
                              eps=case["eps"], foreach=False)
    patch = _F32Torch()
    for step_grads in grads:
        for n, _ in shapes:
            params[n].grad = torch.from_numpy(step_grads[n].copy())
        if case["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_([params[n] for n, _ in shapes], case["clip_norm"])
        if case["bf16"]:
            muon.step()
        else:
            muon_module.torch = patch
            try:
                muon.step()
            finally:
                muon_module.torch = torch
        adamw.step()
    if not case["bf16"]:
        assert patch.casts == len(grads) * len(muon_names), "the bf16 cast of torch's Muon was not intercepted"
    out = {n: params[n].detach().numpy().copy() for n, _ in shapes}
    moms = {n: muon.state[params[n]]["momentum_buffer"].numpy().copy() for n in muon_names}
    return out, moms


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(20251201)
    shapes = hf_tensors(CONFIG)
    init, grads = {}, [{}, {}]
    for n, s in shapes:
        if n.endswith("norm.weight"):
            init[n] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            init[n] = (0.02 * rng.standard_normal(s)).astype(np.float32)
        for g in grads:
            scale = float(10.0 ** rng.uniform(-2, 0))
            g[n] = (scale * rng.standard_normal(s)).astype(np.float32)
    tensors = {}
    for n, _ in shapes:
        tensors["init." + n] = init[n]
        tensors["grad1." + n] = grads[0][n]
        tensors["grad2." + n] = grads[1][n]
    results = {}
    for name, case in CASES.items():
        out, moms = run_case(case, shapes, init, grads)
        results[name] = out
        for n, v in out.items():
            tensors[f"{name}.{n}"] = v
        if name in MOMENTUM_CASES:
            for n, v in moms.items():
                tensors[f"{name}.momentum.{n}"] = v
    # The bf16 Newton-Schulz moves the block matrices by about a percent of their update.
    for n, _ in shapes:
        if is_block_matrix(n):
            d32 = results["original"][n] - init[n]
            d16 = results["original_bf16"][n] - init[n]
            rel = np.linalg.norm(d16 - d32) / np.linalg.norm(d32)
            assert 1e-4 < rel < 0.1, (n, rel)
            print(f"{n}: bf16 vs f32 update relative difference {rel:.2e}")
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    meta = {"torch": torch.__version__, "cases": json.dumps(CASES, sort_keys=True), "no_decay": NO_DECAY}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(OUT_DIR, "muon.safetensors"),
              metadata=meta)
    os.chmod(os.path.join(OUT_DIR, "muon.safetensors"), 0o644)
    print("torch", torch.__version__, "->", os.path.join(OUT_DIR, "muon.safetensors"),
          os.path.getsize(os.path.join(OUT_DIR, "muon.safetensors")), "bytes")


if __name__ == "__main__":
    main()
