# Training goldens for the committed tiny checkpoints that have none yet (and extra cases for
# tiny-llama), made like ../shared/reference/make_fixtures.py: fp32, eager attention, CPU math,
# transformers 5.17 / torch 2.11. Run on the GPU machine from the repository root:
#   OUT=... python3 tests/reference/make_train_fixtures.py
# Writes $OUT/train_fixtures.tar.gz holding <model>/train_golden.safetensors:
#   tiny-qwen3, tiny-llama-biased, tiny-mistral:  train.* (2 x 16 batch, row 1's first 6 labels
#       masked), grad.*, adamw_step1.* (AdamW lr 1e-2, betas (0.9, 0.95), eps 1e-8, wd 0.1),
#       train.loss_after_step1 — q/k norms, o_proj and MLP biases, linear RoPE, untied heads
#   tiny-llama:  ragged.* three rows of 11, 16 and 5 tokens padded to 16 (ragged.lengths), each row
#       its own sequence, loss = mean over all labelled tokens; smooth.* the 2 x 16 batch with
#       label_smoothing 0.1 (smooth.label_smoothing); both with grad.<case>.*
import os, shutil, tarfile, torch, torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
torch.manual_seed(777); torch.set_num_threads(8)
OUT = os.environ.get("OUT", "."); root = "/tmp/train_fixtures"; shutil.rmtree(root, ignore_errors=True); os.makedirs(root)

def load(name):
    m = AutoModelForCausalLM.from_pretrained(os.path.join("testdata", name), attn_implementation="eager").float()
    m.train(); m.zero_grad(); return m

def grads(m, prefix):
    return {prefix + n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}

def standard(name):
    m = load(name); V = m.config.vocab_size; g = {}
    ids = torch.randint(3, V, (2, 16)); labels = ids.clone(); labels[1, :6] = -100
    loss = m(ids, labels=labels).loss; loss.backward()
    g["train.input_ids"] = ids.int(); g["train.labels"] = labels.int(); g["train.loss"] = loss.detach().reshape(1)
    g.update(grads(m, "grad."))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1); opt.step()
    for n, p in m.named_parameters(): g["adamw_step1." + n] = p.detach().clone()
    with torch.no_grad(): g["train.loss_after_step1"] = m(ids, labels=labels).loss.reshape(1)
    return g

def extra_llama():
    g = {}
    m = load("tiny-llama"); V = m.config.vocab_size
    lens = [11, 16, 5]; rows = [torch.randint(3, V, (1, n)) for n in lens]
    ids = torch.zeros(3, 16, dtype=torch.long); labels = torch.full((3, 16), -100, dtype=torch.long)
    total = sum(n - 1 for n in lens); loss_sum = 0.0
    for r, x in enumerate(rows):
        ids[r, :lens[r]] = x[0]; labels[r, :lens[r]] = x[0]
        lg = m(x).logits[0]; loss_sum = loss_sum + F.cross_entropy(lg[:-1], x[0, 1:], reduction="sum")
    loss = loss_sum / total; loss.backward()
    g["ragged.input_ids"] = ids.int(); g["ragged.labels"] = labels.int(); g["ragged.lengths"] = torch.tensor(lens).int()
    g["ragged.loss"] = loss.detach().reshape(1); g.update(grads(m, "grad.ragged."))
    m = load("tiny-llama")
    ids = torch.randint(3, V, (2, 16)); labels = ids.clone(); labels[0, 10:] = -100
    lg = m(ids).logits[:, :-1].reshape(-1, V); tgt = labels[:, 1:].reshape(-1)
    loss = F.cross_entropy(lg, tgt, ignore_index=-100, label_smoothing=0.1); loss.backward()
    g["smooth.input_ids"] = ids.int(); g["smooth.labels"] = labels.int(); g["smooth.loss"] = loss.detach().reshape(1)
    g["smooth.label_smoothing"] = torch.tensor([0.1]); g.update(grads(m, "grad.smooth."))
    return g

jobs = {n: standard for n in ["tiny-qwen3", "tiny-llama-biased", "tiny-mistral"]}
jobs["tiny-llama"] = lambda n: extra_llama()
for name, fn in jobs.items():
    g = fn(name); os.makedirs(os.path.join(root, name))
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(root, name, "train_golden.safetensors"))
    print(name, "ok", len(g), flush=True)
with tarfile.open(os.path.join(OUT, "train_fixtures.tar.gz"), "w:gz") as tf: tf.add(root, arcname="train_fixtures")
print("wrote", os.path.join(OUT, "train_fixtures.tar.gz"))
