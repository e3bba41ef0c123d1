#!/usr/bin/env python3
"""Merge llama-bench '-o json' outputs into one JSON list and print a summary.

    llama_bench_summary.py --out OUT.json [--source TEXT] RUN.json [RUN.json ...]

OUT.json is llama-bench's own records (one per test, in run order), each with
"kiln_peer_source" added (which llama.cpp this was).  One line per test goes
to stdout:

    llama.cpp pp30000           : 1234.567 ms/prompt  (24300.1 tok/s, sd 0.4%, 5 runs)
    llama.cpp tg128 @ d8192     :    1.234 ms/token   (810.2 tok/s, sd 0.3%, 5 runs)

pp: the time to process the whole prompt from an empty cache; tg: the mean
time per generated token with n_depth tokens already in the cache (the depth's
prefill is not timed).
"""
from __future__ import annotations

import argparse
import json
import sys


def load(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"llama_bench_summary.py: cannot read llama-bench JSON {path}: {e}")
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        sys.exit(f"llama_bench_summary.py: {path} is not a list of llama-bench records")
    return data


def line(r: dict) -> str:
    n_prompt, n_gen, depth = int(r["n_prompt"]), int(r["n_gen"]), int(r["n_depth"])
    avg_ms = float(r["avg_ns"]) / 1e6
    sd = 100.0 * float(r["stddev_ns"]) / float(r["avg_ns"]) if float(r["avg_ns"]) else 0.0
    runs = len(r.get("samples_ns", []))
    if n_gen == 0:
        name, value, unit, toks = f"pp{n_prompt}", avg_ms, "ms/prompt", n_prompt
    elif n_prompt == 0:
        name, value, unit, toks = f"tg{n_gen}", avg_ms / n_gen, "ms/token ", n_gen
    else:
        name, value, unit, toks = f"pp{n_prompt}+tg{n_gen}", avg_ms, "ms/test  ", n_prompt + n_gen
    if depth:
        name += f" @ d{depth}"
    tps = toks / (avg_ms / 1e3) if avg_ms else float("inf")
    return f"llama.cpp {name:<18}: {value:10.3f} {unit} ({tps:.1f} tok/s, sd {sd:.1f}%, {runs} runs)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", default="unknown")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()

    records = [r for path in args.runs for r in load(path)]
    if not records:
        sys.exit("llama_bench_summary.py: llama-bench reported no tests")
    for r in records:
        for key in ("n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns"):
            if key not in r:
                sys.exit(f"llama_bench_summary.py: a record lacks {key!r}: {r}")
        r["kiln_peer_source"] = args.source
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(records, f, indent=2)
        f.write("\n")
    first = records[0]
    print(f"llama.cpp peer: {args.source}; model {first.get('model_type', '?')}, "
          f"{first.get('gpu_info', '') or first.get('cpu_info', '')}, "
          f"backends {first.get('backends', '?')}, ngl {first.get('n_gpu_layers', '?')}, "
          f"fa {first.get('flash_attn', '?')}, n_ubatch {first.get('n_ubatch', '?')}")
    for r in records:
        print(line(r))
    print(f"wrote {args.out} ({len(records)} tests)")


if __name__ == "__main__":
    main()
