#!/usr/bin/env python3
"""Encode throughput of the Python `tokenizers` library on one thread, beside bench_tokenizer.

Writes the benchmark text (deterministic: Python sources of the installed `transformers` package
interleaved with multilingual lines) to --text when the file does not exist, then prints JSON with
MB/s for each tokenizer and unit of work ("whole": one encode of the whole text; "lines": one
encode per line). Run:  python3 bench/bench_tokenizer_hf.py --text /tmp/kiln_tok_bench.txt
and then:               build/bin/bench_tokenizer --text /tmp/kiln_tok_bench.txt
"""
import argparse
import json
import os
import random
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKS = ["bytelevel-bpe", "sentencepiece-bpe"]


def make_text(path, target_bytes=4 << 20):
    import transformers
    base = os.path.dirname(transformers.__file__)
    files = []
    for d, _, names in os.walk(base):
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    files.sort()
    golden = json.load(open(os.path.join(ROOT, "testdata", "tokenizers", "golden.json")))
    multi = sorted({c["text"] for c in golden["cases"] if c["text"]})
    rng = random.Random(0)
    out, size = [], 0
    for f in files:
        for line in open(f, encoding="utf-8", errors="replace").read().splitlines():
            out.append(line)
            if rng.random() < 0.3:
                out.append(rng.choice(multi).replace("\n", " "))
            size += len(out[-1].encode()) + 1
        if size >= target_bytes:
            break
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default="/tmp/kiln_tok_bench.txt")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not os.path.exists(args.text):
        make_text(args.text)
    text = open(args.text, encoding="utf-8").read()
    lines = text.splitlines(keepends=True)
    mb = len(text.encode()) / 1e6
    results = []
    for name in TOKS:
        tok = Tokenizer.from_file(os.path.join(ROOT, "testdata", "tokenizers", name + ".tokenizer.json"))
        for unit in ["whole", "lines"]:
            best = float("inf")
            ntok = 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                if unit == "whole":
                    ntok = len(tok.encode(text, add_special_tokens=False).ids)
                else:
                    ntok = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
                best = min(best, time.perf_counter() - t0)
            results.append({"tokenizer": name, "unit": unit, "mb": round(mb, 3), "tokens": ntok,
                            "seconds": round(best, 4), "mb_per_s": round(mb / best, 2)})
    print(json.dumps({"library": "tokenizers", "threads": 1, "results": results}, indent=1))


if __name__ == "__main__":
    main()
