#!/usr/bin/env python3
"""Makes testdata/chat_masks/token_offsets.json: for every fixture tokenizer.json (testdata/tokenizers/,
testdata/tokenizers/more/) and many texts, the ids and Encoding.offsets that the Python `tokenizers`
library gives, without and with special tokens. tests/cpu/test_token_offsets.cpp checks kiln's
Tokenizer::encode_with_offsets against every case (kiln's offsets are UTF-8 bytes; the test converts
them to the characters Python counts).

A case is marked "kiln_refuses" when a Unicode normal form of the tokenizer's normalizer composes or
reorders characters of the text (normalizing the whole text differs from normalizing each character
alone): kiln does not track alignments through that and returns an error instead (see
src/model/tokenizer/normalizers.cpp); the test checks that it does.

Run: /tmp/tokvenv/bin/python tests/reference/make_offset_cases.py   (tokenizers 0.23.3)
"""
import glob
import json
import os
import unicodedata

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "testdata", "chat_masks", "token_offsets.json")

TEXTS = [
    "Hello world! How are you doing today?",
    "",
    " ",
    "a",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nend",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "I'm sure you'll see they've done it, don't worry.",
    "Le café est très bon à Paris. Größe, Straße.",
    "日本語のテキストです。中文文本也在这里。",
    "Привет, как дела? مرحبا بالعالم नमस्ते",
    "emoji 🙂😀👍🏽 family 👨\u200d👩\u200d👧 flags 🇯🇵 and unseen 🦖 𝔘𝔫𝔦",
    "ﬁ ligature, ½ ² Ⅻ, full-width ＡＢＣ１２３",
    "e\u0301 combining vs é precomposed",
    "\u00a0non-breaking\u2009thin\u3000ideographic space",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\nIt is 4.<|im_end|>\n",
    "<s>[INST] Hello [/INST] Hi there</s>",
    "text <mask> with <tool> added  sp tokens hello and hellos",
    "HELLO Hello hello",
    '{"name": "get_weather", "arguments": {"city": "Zürich"}}',
    "İstanbul ǅ ß ΣΑΣ",
    "\u1100\u1161\u11a8 jamo, a\u0308\u0301 stacked marks",
    "ctrl\u0000\u0007 zero\u200bwidth \ufeff bom \ufffd",
]


def normal_forms(normalizer):
    """The Unicode normal forms a normalizer config applies (BertNormalizer's strip_accents is NFD)."""
    if not normalizer:
        return []
    t = normalizer.get("type")
    if t in ("NFC", "NFD", "NFKC", "NFKD"):
        return [t]
    if t == "Sequence":
        return [f for n in normalizer.get("normalizers", []) for f in normal_forms(n)]
    if t == "BertNormalizer":
        strip = normalizer.get("strip_accents")
        if strip is None:
            strip = normalizer.get("lowercase", True)
        return ["NFD"] if strip else []
    return []


def refuses(forms, text):
    return any(unicodedata.normalize(f, text) != "".join(unicodedata.normalize(f, c) for c in text) for f in forms)


def char_offsets_ok(text, offsets):
    return all(0 <= a <= b <= len(text) for a, b in offsets)


def main():
    files = sorted(glob.glob(os.path.join(ROOT, "testdata", "tokenizers", "*.tokenizer.json")) +
                   glob.glob(os.path.join(ROOT, "testdata", "tokenizers", "more", "*.tokenizer.json")))
    cases = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            forms = normal_forms(json.load(f).get("normalizer"))
        tok = Tokenizer.from_file(path)
        rel = os.path.relpath(path, os.path.join(ROOT, "testdata"))
        for text in TEXTS:
            for special in (False, True):
                enc = tok.encode(text, add_special_tokens=special)
                offsets = [list(o) for o in enc.offsets]
                assert char_offsets_ok(text, offsets), (rel, text, offsets)
                cases.append({
                    "tokenizer": rel,
                    "text": text,
                    "add_special_tokens": special,
                    "ids": enc.ids,
                    "offsets": offsets,  # characters of `text`
                    "kiln_refuses": refuses(forms, text),
                })
    with open(OUT, "w", encoding="utf-8") as f:  # one case a line
        f.write('{"tokenizers": "%s", "cases": [\n' % tokenizers.__version__)
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print(f"{OUT}: {len(cases)} cases over {len(files)} tokenizers")


if __name__ == "__main__":
    main()
