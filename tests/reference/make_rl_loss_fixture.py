# The RL loss reference for tests/cpu/test_rl_losses.cpp: kiln's GRPO and DPO losses (the formulas
# of src/rl/losses.h) written in torch, run end to end through tiny-llama (transformers
# LlamaForCausalLM, float32, eager attention, CPU), with every parameter's gradient from autograd.
#
# Run from the repository root in a venv with CPU torch, transformers 5.17, safetensors and numpy:
#   python3 tests/reference/make_rl_loss_fixture.py
# Writes testdata/rl/rl_losses.safetensors:
#   <case>.logprobs         [tokens] f32: log p(token) of every completion token under
#                           softmax(logits / temperature), sequences in order, tokens in order
#   <case>.loss             [1] f32 (the exact double is in the metadata)
#   <case>.grad.<hf name>   d loss / d parameter (backward of that case's loss from zero gradients)
# and in the header's __metadata__: "torch", "transformers" (versions) and "fixture" (JSON: the
# inputs, every case's options and loss; see FIXTURES.md).
#
# GRPO inputs: 6 sequences (prompts of 3..9 tokens, completions of 2..11, ids in [3, 384)) in 2
# groups of 3 with rewards [1, 0, 0] and [1, 1, 1] (the second group's advantages are 0),
# advantages as rl::group_advantages (unbiased std, eps 1e-4, scale_by_std).
# Cases (GRPO: temperature 0.7, clip_low 0.2, clip_high 0.28;
# behaviour log-probs mu = the model's detached log-probs + N(0, 0.1^2), reference ref = detached +
# N(0, 0.2^2), given proximal prox = detached + N(0, 0.3^2)):
#   grpo_a  proximal = current (prox = logp.detach()), token-mean, tis_cap 2, kl_coef 0
#   grpo_b  the given proximal log-probs, seq-mean, tis_cap 1.5, kl_coef 0.05 (clipped ratios and
#           truncated importance weights both occur, and some truncated tokens have A != 0 and are
#           not clipped, so that the truncation changes the gradient: the script asserts it)
#   grpo_c  like grpo_b with tis_cap 0 (no importance weight) and token-mean
#   dpo     3 pairs (prompt, chosen, rejected), beta 0.1, temperature 1, reference sequence
#           log-probs = detached sums + fixed offsets (z = 0.35, -0.45, 0.05 at the detached values)
# The loss arithmetic runs in float64 on the model's f32 log-probs (kiln's is double on its f32
# log-probs); behaviour / proximal / reference log-probs are rounded to f32 first (kiln reads them
# as floats), and the script checks that no ratio or importance weight lies within 1e-3 of a clip
# or truncation bound, where kiln's and torch's last-bit differences could pick different branches.
# Per GRPO case the metadata records the counts of clipped (flat) tokens and truncated weights, which
# the test compares with grpo_loss's. The output is the same from run to run except for the order of
# the __metadata__ keys in the header (the safetensors writer's map).
import json
import os

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.numpy import save_file
from transformers import LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL = os.path.join(ROOT, "testdata", "tiny-llama")
OUT_DIR = os.environ.get("RL_FIXTURE_DIR", os.path.join(ROOT, "testdata", "rl"))
torch.manual_seed(20240611)
torch.set_num_threads(2)

model = LlamaForCausalLM.from_pretrained(MODEL, attn_implementation="eager", dtype=torch.float32)
model.train()  # no dropout in this config; train() only so that autograd is the point
V = model.config.vocab_size


def token_logprobs(seqs, prompt_lens, temperature):
    """Per completion token log p under softmax(logits / T), all sequences concatenated; each
    sequence run alone (no padding)."""
    out = []
    for ids, p in zip(seqs, prompt_lens):
        x = torch.tensor([ids])
        logits = model(x).logits[0].float()  # [L, V]
        lp = F.log_softmax(logits / temperature, dim=-1)
        tgt = x[0, p:]
        out.append(lp[p - 1:len(ids) - 1].gather(1, tgt[:, None])[:, 0])
    return torch.cat(out)


def grads():
    return {n: p.grad.detach().clone().numpy() for n, p in model.named_parameters()}


def f32(t):
    return t.detach().float()


def group_advantages(rewards, group_size, scale_by_std=True, eps=1e-4):
    r = np.asarray(rewards, dtype=np.float64)
    adv = np.zeros_like(r)
    if group_size < 2:
        return adv.tolist()
    for g in range(0, len(r), group_size):
        x = r[g:g + group_size]
        m = x.mean()
        sd = np.sqrt(((x - m) ** 2).sum() / (group_size - 1))
        adv[g:g + group_size] = (x - m) / (sd + eps) if scale_by_std else x - m
    return adv.tolist()


# ---- GRPO inputs ----
T = 0.7
GROUP = 3
prompt_lens = [3, 5, 9, 4, 7, 6]
completion_lens = [11, 8, 10, 2, 6, 3]  # the longer ones in group 0, whose advantages are not 0
seqs = [torch.randint(3, V, (p + c,)).tolist() for p, c in zip(prompt_lens, completion_lens)]
rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # group 1: all equal, advantages 0
adv = group_advantages(rewards, GROUP)
n_tok = sum(completion_lens)
seq_of_token = torch.tensor([i for i, c in enumerate(completion_lens) for _ in range(c)])
adv_tok = torch.tensor(adv, dtype=torch.float64)[seq_of_token]

with torch.no_grad():
    logp0 = token_logprobs(seqs, prompt_lens, T)
mu = f32(logp0 + 0.1 * torch.randn(n_tok))
ref = f32(logp0 + 0.2 * torch.randn(n_tok))
prox_given = f32(logp0 + 0.3 * torch.randn(n_tok))

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
grpo_cases = {
    "grpo_a": dict(proximal="current", aggregation="token-mean", tis_cap=2.0, kl_coef=0.0),
    "grpo_b": dict(proximal="given", aggregation="seq-mean", tis_cap=1.5, kl_coef=0.05),
    "grpo_c": dict(proximal="given", aggregation="token-mean", tis_cap=0.0, kl_coef=0.05),
}


def agg_weights(aggregation):
    if aggregation == "token-mean":
        return torch.full((n_tok,), 1.0 / n_tok, dtype=torch.float64)
    lens = torch.tensor(completion_lens, dtype=torch.float64)[seq_of_token]
    return 1.0 / (len(completion_lens) * lens)


def grpo_loss(logp32, o):
    logp = logp32.double()
    prox = logp.detach() if o["proximal"] == "current" else prox_given.double()
    r = torch.exp(logp - prox)
    pg = -torch.minimum(adv_tok * r, adv_tok * torch.clamp(r, 1 - CLIP_LOW, 1 + CLIP_HIGH))
    if o["tis_cap"] > 0:
        w = torch.clamp(torch.exp(prox - mu.double()), max=o["tis_cap"]).detach()
    else:
        w = torch.ones_like(logp)
    d = ref.double() - logp
    kl = torch.exp(d) - d - 1
    per_tok = w * pg + o["kl_coef"] * kl
    loss = (agg_weights(o["aggregation"]) * per_tok).sum()
    # Statistics, and the margins from the branch points.
    with torch.no_grad():
        rr = r.detach()
        flat = ((adv_tok > 0) & (rr > 1 + CLIP_HIGH)) | ((adv_tok < 0) & (rr < 1 - CLIP_LOW))
        raw_w = torch.exp(prox - mu.double())
        trunc = (raw_w > o["tis_cap"]) if o["tis_cap"] > 0 else torch.zeros_like(flat)
        # truncated_live: truncated tokens whose gradient the weight scales (A != 0, not flat)
        stats = dict(clipped=int(flat.sum()), truncated=int(trunc.sum()),
                     truncated_live=int((trunc & ~flat & (adv_tok != 0)).sum()))
        if o["proximal"] == "given":
            margin = torch.minimum((rr - (1 + CLIP_HIGH)).abs(), (rr - (1 - CLIP_LOW)).abs()).min().item()
            assert margin > 1e-3, margin
        if o["tis_cap"] > 0:
            assert (raw_w - o["tis_cap"]).abs().min().item() > 1e-3
    return loss, stats


fixture = {
    "grpo": {
        "temperature": T, "group_size": GROUP, "scale_by_std": True, "eps": 1e-4,
        "clip_low": CLIP_LOW, "clip_high": CLIP_HIGH,
        "ids": seqs, "prompt_lengths": prompt_lens, "rewards": rewards, "advantages": adv,
        "behaviour_logprobs": mu.tolist(), "reference_logprobs": ref.tolist(),
        "proximal_logprobs": prox_given.tolist(),
    },
    "cases": {},
}
tensors = {}
for name, o in grpo_cases.items():
    model.zero_grad(set_to_none=True)
    logp = token_logprobs(seqs, prompt_lens, T)
    loss, stats = grpo_loss(logp, o)
    loss.backward()
    for n, g in grads().items():
        tensors[f"{name}.grad.{n}"] = g
    tensors[f"{name}.logprobs"] = logp.detach().numpy().astype(np.float32)
    tensors[f"{name}.loss"] = np.array([loss.item()], dtype=np.float32)
    fixture["cases"][name] = dict(kind="grpo", **o, loss=loss.item(), **stats)
    print(name, "loss", loss.item(), stats, flush=True)
assert fixture["cases"]["grpo_b"]["clipped"] >= 2 and fixture["cases"]["grpo_b"]["truncated_live"] >= 2

# ---- DPO ----
BETA = 0.1
pairs = []
for p, c, r in [(4, 5, 8), (7, 9, 4), (3, 3, 6)]:
    prompt = torch.randint(3, V, (p,)).tolist()
    pairs.append(dict(prompt=prompt, chosen=torch.randint(3, V, (c,)).tolist(), rejected=torch.randint(3, V, (r,)).tolist()))
dpo_seqs, dpo_prompts = [], []
for pr in pairs:  # rows: chosen 0, rejected 0, chosen 1, ...
    for part in ("chosen", "rejected"):
        dpo_seqs.append(pr["prompt"] + pr[part])
        dpo_prompts.append(len(pr["prompt"]))


def pair_sums(logp):
    sums, i = [], 0
    for s, p in zip(dpo_seqs, dpo_prompts):
        n = len(s) - p
        sums.append(logp[i:i + n].double().sum())
        i += n
    return sums


with torch.no_grad():
    s0 = pair_sums(token_logprobs(dpo_seqs, dpo_prompts, 1.0))
# Fixed offsets from the detached sums: z = beta (offset_rejected - offset_chosen) = 0.35, -0.45, 0.05.
for k, (pr, (oc, orj)) in enumerate(zip(pairs, [(-2.5, 1.0), (1.5, -3.0), (0.7, 1.2)])):
    pr["reference_chosen"] = s0[2 * k].item() + oc
    pr["reference_rejected"] = s0[2 * k + 1].item() + orj
model.zero_grad(set_to_none=True)
logp = token_logprobs(dpo_seqs, dpo_prompts, 1.0)
s = pair_sums(logp)
zs = [BETA * ((s[2 * k] - pr["reference_chosen"]) - (s[2 * k + 1] - pr["reference_rejected"])) for k, pr in enumerate(pairs)]
loss = torch.stack([-F.logsigmoid(z) for z in zs]).mean()
loss.backward()
for n, g in grads().items():
    tensors[f"dpo.grad.{n}"] = g
tensors["dpo.logprobs"] = logp.detach().numpy().astype(np.float32)
tensors["dpo.loss"] = np.array([loss.item()], dtype=np.float32)
fixture["dpo"] = {"beta": BETA, "temperature": 1.0, "pairs": pairs}
fixture["cases"]["dpo"] = dict(kind="dpo", loss=loss.item(), z=[z.item() for z in zs])
print("dpo loss", loss.item(), "z", [round(z.item(), 4) for z in zs], flush=True)

os.makedirs(OUT_DIR, exist_ok=True)
path = os.path.join(OUT_DIR, "rl_losses.safetensors")
save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path,
          metadata={"torch": torch.__version__, "transformers": transformers.__version__,
                    "fixture": json.dumps(fixture)})
print("wrote", path, os.path.getsize(path), "bytes")
