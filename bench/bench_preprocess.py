#!/usr/bin/env python3
"""kiln preprocess against a Python pipeline doing the same work, on the same files and cores.

Makes deterministic synthetic inputs (text documents and multi-turn chat conversations with tools),
a model folder around testdata's byte-level BPE tokenizer (a ChatML template with generation
blocks), then times
  kiln:   kiln preprocess --format text|chat --seq-len 2048 (all cores)
  python: json parsing, tokenizers' encode_batch (all cores, Rust) + EOS, or transformers'
          apply_chat_template(..., return_assistant_tokens_mask=True) over a multiprocessing pool of
          all cores; then best-fit-decreasing packing into 2048-token rows and the arrays written
          with numpy
and prints JSON with MB/s of input for each and kiln's speed-up. Needs tokenizers, transformers,
jinja2 and numpy. Run:  python3 bench/bench_preprocess.py --kiln build/bin/kiln [--mb 40]
"""
import argparse
import bisect
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ = 2048


def words(rng):
    vocab = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
             "they you were her she there one all we their has been if more when will would who so no model token "
             "training data kernel memory batch gradient über café naïve 東京 データ модель обучение").split()
    return vocab


def make_inputs(dirpath, mb):
    rng = random.Random(0)
    vocab = words(rng)
    text_path, chat_path = os.path.join(dirpath, "text.jsonl"), os.path.join(dirpath, "chat.jsonl")
    with open(text_path, "w") as f:
        size = 0
        while size < mb * 1e6:
            doc = " ".join(rng.choice(vocab) for _ in range(rng.randint(20, 3000)))
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
    with open(chat_path, "w") as f:
        size = 0
        while size < mb * 0.5e6:
            msgs = [{"role": "system", "content": "You answer briefly."}]
            for _ in range(rng.randint(1, 4)):
                msgs.append({"role": "user", "content": " ".join(rng.choice(vocab) for _ in range(rng.randint(5, 80)))})
                msgs.append({"role": "assistant", "content": " ".join(rng.choice(vocab) for _ in range(rng.randint(5, 200)))})
            line = json.dumps({"messages": msgs, "tools": [tool]}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
    return text_path, chat_path


def make_model(dirpath):
    model = os.path.join(dirpath, "model")
    os.makedirs(model, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "testdata", "tokenizers", "bytelevel-bpe.tokenizer.json"),
                os.path.join(model, "tokenizer.json"))
    shutil.copy(os.path.join(ROOT, "testdata", "tiny-chat", "chat_template.jinja"), os.path.join(model, "chat_template.jinja"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
               "eos_token": "<|end_of_text|>", "pad_token": "<|pad|>"}, open(os.path.join(model, "tokenizer_config.json"), "w"))
    return model


def pack_bfd(lengths):
    """Best-fit-decreasing into SEQ-token rows; returns the row count."""
    room, rows = [], 0  # sorted free space of open rows
    for n in sorted(lengths, reverse=True):
        i = bisect.bisect_left(room, n)
        if i == len(room):
            rows += 1
            if SEQ - n > 0:
                bisect.insort(room, SEQ - n)
        else:
            left = room.pop(i) - n
            if left > 0:
                bisect.insort(room, left)
    return rows


def write_rows(out, docs):
    """docs: (ids, mask) lists. Splits them into SEQ-token pieces, packs, writes the arrays."""
    import numpy as np
    lengths = []
    for ids, _ in docs:
        n = len(ids)
        lengths += [SEQ] * (n // SEQ) + ([n % SEQ] if n % SEQ else [])
    pack_bfd(lengths)
    os.makedirs(out, exist_ok=True)
    np.concatenate([np.asarray(d[0], dtype=np.int32) for d in docs]).tofile(os.path.join(out, "ids.bin"))
    np.concatenate([np.asarray(d[1], dtype=np.uint8) for d in docs]).tofile(os.path.join(out, "mask.bin"))


def python_text(model, path, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    eos = tok.token_to_id("<|end_of_text|>")
    start = time.perf_counter()
    docs, batch = [], []

    def flush():
        for enc in tok.encode_batch(batch, add_special_tokens=True):
            ids = enc.ids + [eos]
            docs.append((ids, [0] + [1] * (len(ids) - 1)))
        batch.clear()

    with open(path) as f:
        for line in f:
            batch.append(json.loads(line)["text"])
            if len(batch) == 1024:
                flush()
    flush()
    tokenized = time.perf_counter() - start
    write_rows(out, docs)
    return time.perf_counter() - start, tokenized


_TOK = None


def _chat_init(model):
    global _TOK
    from transformers import AutoTokenizer
    _TOK = AutoTokenizer.from_pretrained(model)


def _chat_one(line):
    j = json.loads(line)
    r = _TOK.apply_chat_template(j["messages"], tools=j.get("tools"), tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    return r["input_ids"], r["assistant_masks"]


def python_chat(model, path, out):
    start = time.perf_counter()
    with open(path) as f:
        lines = f.readlines()
    with mp.Pool(os.cpu_count(), initializer=_chat_init, initargs=(model,)) as pool:
        docs = pool.map(_chat_one, lines, chunksize=64)
    tokenized = time.perf_counter() - start
    write_rows(out, docs)
    return time.perf_counter() - start, tokenized


def kiln_run(kiln, model, path, out, fmt):
    start = time.perf_counter()
    subprocess.run([kiln, "preprocess", "--model", model, "--input", path, "--output", out, "--seq-len", str(SEQ),
                    "--format", fmt, "--overwrite"], check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--mb", type=float, default=40.0, help="size of the text input; chat is half")
    ap.add_argument("--skip-chat", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln_bench_pre_")
    try:
        text_path, chat_path = make_inputs(tmp, args.mb)
        model = make_model(tmp)
        result = {"cores": os.cpu_count(), "seq_len": SEQ}
        runs = [("text", text_path, python_text)] + ([] if args.skip_chat else [("chat", chat_path, python_chat)])
        for fmt, path, py in runs:
            mb = os.path.getsize(path) / 1e6
            k = kiln_run(args.kiln, model, path, os.path.join(tmp, "k_" + fmt), fmt)
            p, p_tok = py(model, path, os.path.join(tmp, "p_" + fmt))
            result[fmt] = {"input_mb": round(mb, 2), "kiln_s": round(k, 3), "python_s": round(p, 3),
                           "python_tokenize_only_s": round(p_tok, 3), "kiln_mb_s": round(mb / k, 2),
                           "python_mb_s": round(mb / p, 2), "kiln_speedup": round(p / k, 2),
                           "kiln_speedup_vs_python_tokenize_only": round(p_tok / k, 2)}
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
