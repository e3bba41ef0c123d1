#!/usr/bin/env python3
"""Write a Hugging Face Llama checkpoint with seeded random bf16 weights.

    random_hf_llama.py CONFIG.json OUTDIR [--seed N] [--std 0.02]

OUTDIR gets config.json (CONFIG as given), model.safetensors and a
SentencePiece tokenizer.model with exactly vocab_size pieces, which
llama.cpp's convert_hf_to_gguf.py accepts without network: it reads a
tokenizer.model before anything else, and a SentencePiece vocabulary needs no
pre-tokenizer hash (a tokenizer.json would, and only known ones pass).

The pieces are <unk>, <s> and </s> at the config's bos/eos ids, the 256 byte
pieces <0x00>..<0xFF>, and made-up words for the rest.  Performance does not
depend on the weights' values or the vocabulary's strings; llama-bench feeds
random token ids.

Weights: normal(0, std) for matrices, ones for RMSNorm weights.  torch makes
them when importable (multi-threaded), numpy otherwise; the safetensors file
is written here directly, one tensor at a time, so neither the safetensors
package nor memory for the whole model is needed.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

try:
    import torch
except ImportError:  # numpy fallback
    torch = None
import numpy as np


# ------------------------------------------------------------------ weights
def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "vocab_size"):
        if key not in cfg:
            sys.exit(f"random_hf_llama.py: config lacks {key}")
    h = cfg["hidden_size"]
    ff = cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or h // nh
    v = cfg["vocab_size"]
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (nh * hd, h)),
            (p + "self_attn.k_proj.weight", (nkv * hd, h)),
            (p + "self_attn.v_proj.weight", (nkv * hd, h)),
            (p + "self_attn.o_proj.weight", (h, nh * hd)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (ff, h)),
            (p + "mlp.up_proj.weight", (ff, h)),
            (p + "mlp.down_proj.weight", (h, ff)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


class Random:
    """bf16 bytes of normal(0, std) tensors, from one seeded stream."""

    def __init__(self, seed: int, std: float):
        self.std = std
        if torch is not None:
            self.gen = torch.Generator().manual_seed(seed)
        else:
            self.rng = np.random.default_rng(seed)

    def normal_bf16(self, shape: tuple[int, ...]) -> bytes:
        if torch is not None:
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, self.std, generator=self.gen)
            return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        x = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(self.std)).view(np.uint32)
        # round to nearest even, as torch does
        return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16).tobytes()

    @staticmethod
    def ones_bf16(shape: tuple[int, ...]) -> bytes:
        return np.full(shape, 0x3F80, dtype=np.uint16).tobytes()  # 1.0 in bf16


def write_safetensors(path: Path, shapes, rnd: Random) -> int:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape in shapes:
            data = rnd.ones_bf16(shape) if name.endswith("norm.weight") else rnd.normal_bf16(shape)
            assert len(data) == header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            f.write(data)
    os.replace(tmp, path)
    return offset // 2


# ------------------------------------------------------------------ tokenizer
# sentencepiece_model.proto, written by hand so no protobuf package is needed.
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
BPE = 2


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _int_field(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def _word(k: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    s = ""
    k += 1
    while k:
        k, r = divmod(k - 1, 26)
        s = letters[r] + s
    return s


def sentencepiece_model(vocab_size: int, unk: int, bos: int, eos: int) -> bytes:
    special = {unk: ("<unk>", UNKNOWN), bos: ("<s>", CONTROL), eos: ("</s>", CONTROL)}
    if len(special) != 3:
        sys.exit(f"random_hf_llama.py: unk/bos/eos ids must differ (got {unk}, {bos}, {eos})")
    if vocab_size < 3 + 256 + 1 or max(special) >= vocab_size:
        sys.exit(f"random_hf_llama.py: vocab_size {vocab_size} too small for the special and byte pieces")
    pieces = []
    next_byte = 0
    word = 0
    for i in range(vocab_size):
        if i in special:
            text, typ = special[i]
            score = 0.0
        elif next_byte < 256:
            text, typ, score = f"<0x{next_byte:02X}>", BYTE, 0.0
            next_byte += 1
        else:
            # '▁' marks a word start, as in Llama's own vocabulary.
            text = ("\u2581" if word % 2 == 0 else "") + _word(word // 2)
            typ, score = NORMAL, -float(word)
            word += 1
        body = _bytes_field(1, text.encode()) + _key(2, 5) + struct.pack("<f", score)
        if typ != NORMAL:
            body += _int_field(3, typ)
        pieces.append(_bytes_field(1, body))
    trainer = (_int_field(3, BPE) + _int_field(4, vocab_size) + _int_field(35, 1)
               + _int_field(40, unk) + _int_field(41, bos) + _int_field(42, eos) + _int_field(43, -1))
    normalizer = (_bytes_field(1, b"identity") + _int_field(3, 1) + _int_field(4, 0)
                  + _int_field(5, 1))
    return b"".join(pieces) + _bytes_field(2, trainer) + _bytes_field(3, normalizer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--std", type=float, default=0.02)
    args = ap.parse_args()

    cfg = json.loads(args.config.read_text())
    arch = cfg.get("architectures", ["LlamaForCausalLM"])
    if cfg.get("model_type") != "llama" or arch != ["LlamaForCausalLM"]:
        sys.exit(f"random_hf_llama.py: {args.config} is not a Llama config "
                 f"(model_type {cfg.get('model_type')!r}, architectures {arch})")
    args.outdir.mkdir(parents=True, exist_ok=True)

    vocab = cfg["vocab_size"]
    bos, eos = cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2)
    if isinstance(eos, list):
        eos = eos[0]
    unk = next(i for i in range(3) if i not in (bos, eos))
    (args.outdir / "tokenizer.model").write_bytes(sentencepiece_model(vocab, unk, bos, eos))
    (args.outdir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": cfg.get("max_position_embeddings", 4096),
    }, indent=2) + "\n")
    (args.outdir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    n = write_safetensors(args.outdir / "model.safetensors", tensor_shapes(cfg),
                          Random(args.seed, args.std))
    print(f"{args.outdir}: {n / 1e6:.1f}M parameters, bf16, seed {args.seed} "
          f"({'torch' if torch is not None else 'numpy'}), vocabulary {vocab}")


if __name__ == "__main__":
    main()
