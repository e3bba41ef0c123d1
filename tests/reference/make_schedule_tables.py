#!/usr/bin/env python3
"""Makes testdata/schedules.json: the learning rate torch's optimizer sees at every step under
transformers' schedule functions (LambdaLR over an SGD optimizer stepped as a trainer steps it), for
kiln's train/schedule.h to match value for value. Needs torch and transformers (the GPU machine).

Run: python3 tests/reference/make_schedule_tables.py OUT.json
"""
import json
import sys

import torch
import transformers
from transformers import optimization as o

BASE_LR = 3e-4
CASES = [
    ("constant", dict(warmup_steps=0, total_steps=12), lambda opt, c: o.get_constant_schedule_with_warmup(opt, 0)),
    ("constant", dict(warmup_steps=5, total_steps=12), lambda opt, c: o.get_constant_schedule_with_warmup(opt, 5)),
    ("linear", dict(warmup_steps=0, total_steps=10), lambda opt, c: o.get_linear_schedule_with_warmup(opt, 0, 10)),
    ("linear", dict(warmup_steps=3, total_steps=17), lambda opt, c: o.get_linear_schedule_with_warmup(opt, 3, 17)),
    ("cosine", dict(warmup_steps=4, total_steps=20), lambda opt, c: o.get_cosine_schedule_with_warmup(opt, 4, 20)),
    ("cosine", dict(warmup_steps=0, total_steps=7), lambda opt, c: o.get_cosine_schedule_with_warmup(opt, 0, 7)),
    ("cosine", dict(warmup_steps=3, total_steps=25, min_lr_ratio=0.1),
     lambda opt, c: o.get_cosine_with_min_lr_schedule_with_warmup(opt, 3, 25, min_lr_rate=0.1)),
    ("wsd", dict(warmup_steps=4, total_steps=30, decay_steps=10),
     lambda opt, c: o.get_wsd_schedule(opt, 4, 10, num_training_steps=30)),
    ("wsd", dict(warmup_steps=2, total_steps=16, decay_steps=6, min_lr_ratio=0.05),
     lambda opt, c: o.get_wsd_schedule(opt, 2, 6, num_training_steps=16, min_lr_ratio=0.05)),
    ("wsd", dict(warmup_steps=0, total_steps=9, decay_steps=9),
     lambda opt, c: o.get_wsd_schedule(opt, 0, 9, num_training_steps=9)),
]


def main():
    out = []
    for kind, cfg, make in CASES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=BASE_LR)
        sched = make(opt, cfg)
        lrs = []
        for _ in range(cfg["total_steps"] + 3):  # past the end too
            lrs.append(opt.param_groups[0]["lr"])
            p.grad = torch.zeros(1)
            opt.step()
            sched.step()
        out.append({"kind": kind, **cfg, "base_lr": BASE_LR, "lr": lrs})
    with open(sys.argv[1], "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": out}, f, indent=1)
    print(len(out), "schedules ->", sys.argv[1])


if __name__ == "__main__":
    main()
