# Loads a checkpoint written by `kiln train` with transformers and prints, as JSON, the
# log-probability of each token of --ids given its prefix (the same quantity `kiln score` prints),
# so the two can be compared. Run on the GPU machine (torch + transformers):
#   python3 tests/reference/check_trained_checkpoint.py DIR --ids 5,6,7,8
import argparse, json, torch
from transformers import AutoModelForCausalLM
p = argparse.ArgumentParser(); p.add_argument("dir"); p.add_argument("--ids", required=True); a = p.parse_args()
ids = torch.tensor([[int(x) for x in a.ids.split(",")]])
m = AutoModelForCausalLM.from_pretrained(a.dir, attn_implementation="eager").float().eval()
with torch.no_grad(): lp = torch.log_softmax(m(ids).logits[0].float(), -1)
out = [None] + [lp[t - 1, ids[0, t]].item() for t in range(1, ids.shape[1])]
print(json.dumps({"dtype": str(next(m.parameters()).dtype), "logprobs": out}))
