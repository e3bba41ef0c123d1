#!/usr/bin/env python3
"""Makes testdata/tokenizers/more/: real-format tokenizer.json files trained with the Python
`tokenizers` library (plus variants of them with other normalizers / pre-tokenizers / decoders),
and cases.json with, for many texts, the ids without and with special tokens and the decoded texts,
all from `tokenizers` itself. kiln's tests/cpu/test_tokenizer.cpp checks every case.

Run: python3 tests/reference/make_tokenizer_cases.py   (tokenizers 0.23)
"""
import json
import os

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "testdata", "tokenizers", "more")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see what they've done!",
    "Hello world! How are you doing today? I'm fine, thanks; don't worry about it.",
    "Le café est très bon à Paris. Größe, Straße, Übermut. Ça va? Où est la bibliothèque?",
    "日本語のテキストです。東京は大きい都市です。中文文本也在这里。한국어 문장입니다.",
    "Привет, как дела? Всё хорошо. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया।",
    "def f(x):\n    return x**2  # square\n\nfor i in range(10):\n\tprint(i, f(i))\n",
    "Numbers: 1,000,000.00 and 007; 3.14159 is pi; 12345678901234567890; phone 555-0199.",
    "Emoji 🙂😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flags 🇯🇵🇫🇷 hearts ❤️💙.",
    "URLs like https://example.com/path?q=1&r=2#frag and e-mails like a.b@c.org appear.",
    "ﬁ ligature, Å vs Å, e\u0301 vs é, ½ and ² and Ⅻ, full-width ＡＢＣ１２３.",
    "   leading spaces and trailing spaces   and \t tabs \n\n newlines.",
    "JSON: {\"key\": [1, 2, 3], 'other': null}  <html><body>text</body></html>",
] * 30

TEXTS = [
    "Hello world! How are you doing today?",
    "",
    " ",
    "   ",
    "a",
    "The year 2024 had 366 days; 3.14159 is pi.",
    "I'm sure you'll see they've done it, don't worry.",
    "don't DON'T I'M we'll",
    "Le café est très bon à Paris.",
    "Größe, Straße, Übermut",
    "日本語のテキストです。",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "한국어 문장입니다",
    "ZWJ family 👨\u200d👩\u200d👧\u200d👦 and flags 🇯🇵",
    "🙂🙂🙂🙂🙂🙂🙂🙂",
    "unseen 🦖 dinosaur and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "e\u0301 combining vs é precomposed, a\u0308\u0301 stacked",
    "ﬁ ligature and Å vs Å, ½ ² Ⅻ ＡＢＣ１２３",
    "\u00a0non-breaking\u2009thin\u3000ideographic space",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nend",
    "mixed \t \n whitespace \r\n runs",
    "def f(x):\n    return x**2  # square\n",
    "x = [1, 2, 3]; y = {'k': \"v\"}",
    "12345678901234567890",
    "1,000,000.00 and 007",
    "https://example.com/path?q=1&r=2#frag",
    "İstanbul ΣΊΣΥΦΟΣ ǅ",
    "UPPER lower MiXeD",
    "word_with_underscores and-hyphens",
]


def specials_in_text(specials):
    # Texts with the tokenizer's added tokens inside, next to spaces and words.
    out = []
    for s in specials[:4]:
        out += [f"{s}", f"before {s} after", f"x{s}y", f"  {s}  spaced", f"{s}{s}"]
    if len(specials) >= 2:
        out.append(f"{specials[0]}user\nhi{specials[1]}")
    return out


def train_bpe(tok, special, **kw):
    trainer = trainers.BpeTrainer(vocab_size=kw.pop("vocab_size", 1200), special_tokens=special, show_progress=False, **kw)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def gpt2_bytelevel():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, ["<s>", "<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello", single_word=True, normalized=True),
                    AddedToken("<tool>", rstrip=True, normalized=False),
                    AddedToken(" sp", lstrip=True, rstrip=True, normalized=False)])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    return tok, ["<s>", "</s>", "<mask>", "<tool>", "hello", " sp"]


def llama3_ignore_merges():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    return tok, ["<|begin_of_text|>", "<|eot_id|>"]


def metaspace_fallback():
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    train_bpe(tok, ["<unk>", "<s>", "</s>"] + byte_tokens, limit_alphabet=150)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    tok.add_tokens([AddedToken("<|user|>", normalized=False, lstrip=True, rstrip=True)])
    return tok, ["<s>", "</s>", "<|user|>"]


def normalized_words():
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                           normalizers.Replace(Regex(r"\s+"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##")
    train_bpe(tok, ["[UNK]", "[CLS]", "[SEP]", "[MASK]"], continuing_subword_prefix="##", limit_alphabet=300)
    tok.add_tokens([AddedToken("New York", normalized=True, single_word=True),
                    AddedToken("[MASK]", normalized=False, lstrip=True, special=True),
                    AddedToken("<B>", normalized=True, rstrip=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tok, ["[CLS]", "[SEP]", "[MASK]", "New York", "<B>"]


def suffix_words():
    tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    train_bpe(tok, ["<unk>", "<s>", "</s>"], end_of_word_suffix="</w>", limit_alphabet=200)
    tok.post_processor = processors.BertProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    return tok, ["<s>", "</s>"]


def variants(base_json, mutate_list):
    """Variants of a trained tokenizer: the same model with other components (JSON edits)."""
    out = []
    for name, mutate in mutate_list:
        j = json.loads(base_json)
        mutate(j)
        out.append((name, Tokenizer.from_str(json.dumps(j))))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    made = []
    for name, fn in [("gpt2-bytelevel", gpt2_bytelevel), ("llama3-ignore-merges", llama3_ignore_merges),
                     ("metaspace-fallback", metaspace_fallback), ("normalized-words", normalized_words),
                     ("suffix-words", suffix_words)]:
        tok, specials = fn()
        made.append((name, tok, specials))

    # Variants on the normalized-words model (Whitespace-level vocabulary with ## prefixes).
    base = made[3][1].to_str()
    split_variants = []
    for beh in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for inv in [False, True]:
            def m(j, beh=beh, inv=inv):
                j["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": r"[\s,.!?]+|\d"}, "behavior":
                                      "".join(w.capitalize() for w in beh.split("_")), "invert": inv}
            split_variants.append((f"split-{beh}{'-invert' if inv else ''}", m))
    def string_split(j):
        j["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False}
    def norm_forms(j):
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Strip", "strip_left": True, "strip_right": False},
                                                               {"type": "Prepend", "prepend": "_"}, {"type": "Replace", "pattern": {"String": "e"}, "content": "E"}]}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": False},
                                                                     {"type": "Punctuation", "behavior": "Contiguous"}]}
    def nfd_bert(j):
        j["normalizer"] = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None, "lowercase": True}
        j["pre_tokenizer"] = {"type": "BertPreTokenizer"}
    def nfc_only(j):
        j["normalizer"] = {"type": "NFC"}
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}
        j["decoder"] = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 1}]}
    for name, tok in variants(base, split_variants + [("split-string", string_split), ("norm-forms", norm_forms),
                                                     ("bert-normalizer", nfd_bert), ("nfc-metaspace-always", nfc_only)]):
        made.append((name, tok, ["[CLS]", "[MASK]", "New York"]))

    # Variants on the metaspace model: never / always, no split.
    base = made[2][1].to_str()
    def ms(scheme, split):
        def m(j):
            j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}
            j["decoder"]["decoders"][1]["prepend_scheme"] = scheme
        return m
    for name, tok in variants(base, [("metaspace-never", ms("never", True)), ("metaspace-always-nosplit", ms("always", False))]):
        made.append((name, tok, ["<s>", "</s>", "<|user|>"]))

    cases = []
    for name, tok, specials in made:
        tok.save(os.path.join(OUT, name + ".tokenizer.json"))
        # Reload from the file, as kiln does, so the cases describe exactly the saved JSON.
        tok = Tokenizer.from_file(os.path.join(OUT, name + ".tokenizer.json"))
        for text in TEXTS + specials_in_text(specials):
            e1 = tok.encode(text, add_special_tokens=False)
            e2 = tok.encode(text, add_special_tokens=True)
            cases.append({"tokenizer": name, "text": text, "ids": e1.ids, "ids_with_special": e2.ids,
                          "decoded": tok.decode(e1.ids, skip_special_tokens=False),
                          "decoded_with_special": tok.decode(e2.ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(e2.ids, skip_special_tokens=True)})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False, indent=0)
    print(len(made), "tokenizers,", len(cases), "cases ->", OUT)


if __name__ == "__main__":
    main()
