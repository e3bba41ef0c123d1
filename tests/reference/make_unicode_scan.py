#!/usr/bin/env python3
"""Makes testdata/tokenizers/unicode/scan.json: every code point U+0000..U+10FFFF (surrogates
excepted: Rust strings cannot hold them) run through each tokenizer component that depends on
Unicode data, and through whole tokenizers, by the `tokenizers` library itself.

Each scan names a component (its tokenizer.json form) or a tokenizer file, and probe texts in which
"{}" stands for the code point. For every code point, in order, the outputs of all probes are
serialized (below) and appended to the current block of 1024 code points; the file keeps the CRC-32
of each block. kiln's tests/cpu/test_unicode_scan.cpp computes the same bytes with kiln's
components and compares block by block; a failing block names its range, and `--explain NAME CP`
here prints the reference output for one code point.

Serialization per probe: normalizer: the UTF-8 output, then 0xFF. Pre-tokenizer: each piece's
UTF-8 followed by 0xFE, then 0xFF. Tokenizer: each id in decimal followed by ',', then 0xFF.

Run: python3 tests/reference/make_unicode_scan.py     (tokenizers 0.23.3; about 3 minutes on 2 cores)
"""
import json
import multiprocessing
import os
import sys
import zlib

import tokenizers
from tokenizers import Regex, Tokenizer, models, normalizers as N, pre_tokenizers as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKDIR = os.path.join(ROOT, "testdata", "tokenizers")
OUT = os.path.join(TOKDIR, "unicode", "scan.json")
BLOCK = 1024

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = (r"[\r\n]|\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba]+|\s?[!-/:-~！-／：-～‘-‟　-。]+|"
            r"\s?[\p{L}\p{M}]+|\s?\p{P}+|\s?\p{S}+|\p{Nd}{1,3}|[一-龥\u3040-ゟ゠-ヿ]+|\s+(?!\S)|\s+")
CLASSES = r"[^\P{Lu}]+|\h+|[\p{Greek}\p{Han}]+|\d+|[[:alpha:]]+|\w+|\p{^Ll}"

# (name, kind, component or file, probes)
SCANS = [
    ("nfd", "normalizer", N.NFD(), ["{}", "a{}", "{}\u0316\u0301"]),
    ("nfkd", "normalizer", N.NFKD(), ["{}", "a{}", "{}\u0316\u0301"]),
    ("nfc", "normalizer", N.NFC(), ["{}", "a{}", "{}\u0316\u0301"]),
    ("nfkc", "normalizer", N.NFKC(), ["{}", "a{}", "{}\u0316\u0301"]),
    ("lowercase", "normalizer", N.Lowercase(), ["{}"]),
    ("strip", "normalizer", N.Strip(left=True, right=True), ["{}a{}"]),
    ("strip-accents", "normalizer", N.StripAccents(), ["a{}"]),
    ("bert", "normalizer", N.BertNormalizer(), ["a{}b"]),
    ("bert-cased", "normalizer", N.BertNormalizer(strip_accents=False, lowercase=False), ["a{}b"]),
    ("bert-accents", "normalizer", N.BertNormalizer(handle_chinese_chars=False, strip_accents=True, lowercase=False), ["a{}"]),
    ("replace-regex", "normalizer", N.Replace(Regex(r"\s+"), " "), ["a{}{}b"]),
    ("byte-level", "pre_tokenizer", P.ByteLevel(add_prefix_space=False, use_regex=True), ["a{}b", "1{}2", " {}{}"]),
    ("whitespace", "pre_tokenizer", P.Whitespace(), ["a{}b", " {}."]),
    ("whitespace-split", "pre_tokenizer", P.WhitespaceSplit(), ["a{}b"]),
    ("digits", "pre_tokenizer", P.Digits(individual_digits=False), ["1{}2"]),
    ("digits-individual", "pre_tokenizer", P.Digits(individual_digits=True), ["a{}b"]),
    ("punctuation", "pre_tokenizer", P.Punctuation(), ["a{}b"]),
    ("bert-pre", "pre_tokenizer", P.BertPreTokenizer(), ["a{}b"]),
    ("split-llama3", "pre_tokenizer", P.Split(Regex(LLAMA3), "isolated"), ["a{}b", "1{}2", " {}{}", "'{}", "\n{}"]),
    ("split-gpt4o", "pre_tokenizer", P.Split(Regex(GPT4O), "isolated"), ["a{}b", "A{}b", " {}{}"]),
    ("split-deepseek", "pre_tokenizer", P.Split(Regex(DEEPSEEK), "isolated"), ["a{}b", " {}{}"]),
    ("split-classes", "pre_tokenizer", P.Split(Regex(CLASSES), "isolated"), ["a{}b", "0{}"]),
    ("tok-bytelevel-bpe", "tokenizer", "bytelevel-bpe.tokenizer.json", ["x{}y"]),
    ("tok-sentencepiece-bpe", "tokenizer", "sentencepiece-bpe.tokenizer.json", ["x{}y"]),
    ("tok-gpt2-bytelevel", "tokenizer", "more/gpt2-bytelevel.tokenizer.json", ["x{}y", "{}hello{}"]),
    ("tok-bert-normalizer", "tokenizer", "more/bert-normalizer.tokenizer.json", ["x{}y"]),
    ("tok-norm-forms", "tokenizer", "more/norm-forms.tokenizer.json", ["x{}y"]),
    ("tok-normalized-words", "tokenizer", "more/normalized-words.tokenizer.json", ["x{}y", "{}New York{}"]),
    ("tok-split-isolated", "tokenizer", "more/split-isolated.tokenizer.json", ["x{}y"]),
    ("tok-suffix-words", "tokenizer", "more/suffix-words.tokenizer.json", ["x{}y"]),
    ("tok-nfc-metaspace-always", "tokenizer", "more/nfc-metaspace-always.tokenizer.json", ["x{}y"]),
    ("tok-metaspace-fallback", "tokenizer", "more/metaspace-fallback.tokenizer.json", ["x{}y"]),
]


def component_json(kind, obj):
    tok = Tokenizer(models.BPE())
    setattr(tok, kind, obj)
    return json.loads(tok.to_str())[kind]


def runner(kind, obj):
    if kind == "normalizer":
        return lambda s: obj.normalize_str(s).encode() + b"\xff"
    if kind == "pre_tokenizer":
        return lambda s: b"".join(p.encode() + b"\xfe" for p, _ in obj.pre_tokenize_str(s)) + b"\xff"
    tok = Tokenizer.from_file(os.path.join(TOKDIR, obj))
    return lambda s: "".join(f"{i}," for i in tok.encode(s, add_special_tokens=False).ids).encode() + b"\xff"


def code_points():
    return (c for c in range(0x110000) if not 0xD800 <= c < 0xE000)


def scan(index):
    name, kind, obj, probes = SCANS[index]
    run = runner(kind, obj)
    crcs = [0] * (0x110000 // BLOCK)
    for c in code_points():
        ch = chr(c)
        b = c // BLOCK
        for p in probes:
            crcs[b] = zlib.crc32(run(p.replace("{}", ch)), crcs[b])
    entry = {"name": name, "kind": kind, "probes": probes}
    if kind == "tokenizer":
        entry["file"] = obj
    else:
        entry["component"] = component_json(kind, obj)
    entry["crc32"] = " ".join(f"{x:08x}" for x in crcs)
    print(name, flush=True)
    return entry


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--explain":
        name, cp = sys.argv[2], int(sys.argv[3], 16)
        for n, kind, obj, probes in SCANS:
            if n == name:
                run = runner(kind, obj)
                for p in probes:
                    print(repr(p), run(p.replace("{}", chr(cp))))
        return
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with multiprocessing.Pool(os.cpu_count()) as pool:
        scans = pool.map(scan, range(len(SCANS)))
    with open(OUT, "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "block": BLOCK, "hash": "crc32",
                   "scans": scans}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(len(scans), "scans ->", OUT)


if __name__ == "__main__":
    main()
