#!/usr/bin/env python3
"""Writes the seed corpora of kiln's fuzz targets (fuzz/corpus/<target>/seed-*) from testdata/.
Run from the repository root; the output is committed. Inputs the fuzzer finds that once broke a
target go beside the seeds as regress-* files (scripts/fuzz.sh prints where crashes land)."""
import json, os, struct, glob

root = "fuzz/corpus"

def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))

# tokenizer_encode: the golden tokenizer texts.
for i, c in enumerate(json.load(open("testdata/tokenizers/golden.json"))["cases"]):
    put("tokenizer_encode", f"golden{i:02d}", c["text"])

# tokenizer_json: small versions of the test tokenizers (BPE vocabularies cut to 300 ids, merges
# kept where both parts and the result survive).
for path in sorted(glob.glob("testdata/tokenizers/more/*.tokenizer.json"))[:8] + \
            ["testdata/tokenizers/bytelevel-bpe.tokenizer.json", "testdata/tokenizers/sentencepiece-bpe.tokenizer.json"]:
    j = json.load(open(path))
    m = j["model"]
    if m.get("type") == "BPE":
        vocab = {k: v for k, v in m["vocab"].items() if v < 300}
        merges = []
        for mg in m.get("merges", []):
            a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
            if a in vocab and b in vocab and (a + b) in vocab:
                merges.append(mg)
        m["vocab"], m["merges"] = vocab, merges
        j["added_tokens"] = [t for t in j.get("added_tokens", []) if t["id"] < 300]
    put("tokenizer_json", os.path.basename(path).replace(".tokenizer.json", ""), json.dumps(j, ensure_ascii=False))

# config_json: the fixture models' configs.
for path in sorted(glob.glob("testdata/*/config.json")):
    put("config_json", path.split("/")[1], open(path).read())

# safetensors_header: small files in the format (u64 header length, JSON header, data).
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
put("safetensors_header", "f32", safetensors({"w": ("F32", [2, 3], struct.pack("<6f", *range(6)))}, {"format": "pt"}))
put("safetensors_header", "mixed", safetensors({"a": ("BF16", [4], b"\x80\x3f" * 4), "b": ("I32", [1, 2], struct.pack("<2i", 1, 2)),
                                                "c": ("F16", [0], b""), "d": ("F64", [1], struct.pack("<d", 1.0))}))
put("safetensors_header", "scalar", safetensors({"s": ("F32", [], struct.pack("<f", 1.0))}))

# chat_template: the model templates of the fixtures, one with messages and tools after a NUL.
for path in sorted(glob.glob("testdata/chat_templates/models/*/chat_template.jinja")):
    put("chat_template", path.split("/")[3], open(path).read())
msgs = [{"role": "user", "content": "what is 2+2?"}, {"role": "assistant", "content": "4"}]
put("chat_template", "with-context", "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}" + "\0" +
    json.dumps({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}))
put("chat_template", "macros", "{% macro f(x) %}{{ x * 2 }}{% endmacro %}{% set ns = namespace(a=[]) %}"
    "{% for i in range(3) %}{% set ns.a = ns.a + [f(i)] %}{% endfor %}{{ ns.a | join(',') }} {{ 'x' * 3 }} {{ messages | tojson }}")

# training_jsonl: lines the reader takes, and the optional fields.
put("training_jsonl", "ids", '{"input_ids": [5, 6, 7]}\n{"input_ids": [1, 2, 3, 4]}\n')
put("training_jsonl", "labels", '{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}\n\n{"input_ids": [9], "labels": [9]}\n')
put("training_jsonl", "positions", '{"input_ids": [5, 6, 7, 8], "position_ids": [0, 1, 0, 1]}\n')

# kiln_shard: shards as train/shards.h lays them out (64-byte header, sections at multiples of 64).
def shard(rows):
    offsets, starts, ids, mask = [0], [], [], []
    for docs in rows:
        for d in docs:
            starts.append(len(ids)); ids += d; mask += [0] + [1] * (len(d) - 1)
        offsets.append(len(ids))
    pad = lambda b: b + b"\0" * (-len(b) % 64)
    out = pad(b"KILNSHD1" + struct.pack("<IIqqq", 1, 64, len(rows), len(ids), len(starts)) + b"\0" * 24)
    out = pad(out + struct.pack("<%dq" % len(offsets), *offsets))
    out = pad(out + struct.pack("<%dq" % len(starts), *starts))
    out = pad(out + struct.pack("<%di" % len(ids), *ids))
    return out + bytes(mask)
put("kiln_shard", "two-rows", shard([[[5, 6, 7], [8, 9]], [[10, 11, 12, 13]]]))
put("kiln_shard", "one-row", shard([[[1]]]))

# regex_pattern: the Oniguruma patterns of the Unicode scan and of the regex tests, each with a subject.
scan = json.load(open("testdata/tokenizers/unicode/scan.json"))
pats = [s["component"]["pattern"]["Regex"] for s in scan["scans"] if "component" in s and "pattern" in s["component"]]
pats += [r"(?i)[^a-c\d]+", r"[\w&&[^\d]]+", r"(?m)^a.+$", r"[[:^alpha:][:punct:]]{,3}", r"\p{^Greek}\h\u00e9\x{1F600}[]a-]"]
for i, p in enumerate(pats):
    put("regex_pattern", f"p{i:02d}", p + "\0" + "It's 2024: Größe 東京 \r\n  x\u00b2 Ω")

# serve_request: HTTP requests as clients send them to kiln serve (testdata/tiny-tools).
def http_post(path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data

tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
serve_seeds = {
    "chat": ("/v1/chat/completions", {"model": "tiny-tools", "messages": [{"role": "user", "content": "Hi!"}], "stream": True,
                                      "stream_options": {"include_usage": True}, "n": 2, "stop": ["x"], "logprobs": True, "top_logprobs": 2}),
    "chat_tools": ("/v1/chat/completions", {"model": "tiny-tools", "tools": [tool], "tool_choice": "required", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
    "completion": ("/v1/completions", {"model": "tiny-tools", "prompt": ["Once upon a time", [1, 2, 3]], "max_tokens": 5, "echo": True, "logprobs": 1}),
    "messages": ("/v1/messages", {"model": "tiny-tools", "max_tokens": 20, "system": "Be brief.", "stop_sequences": ["y"], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}}),
}
for name, (path, body) in serve_seeds.items():
    put("serve_request", name, http_post(path, body))
