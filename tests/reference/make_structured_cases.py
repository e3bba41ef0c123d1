"""Reference verdicts for kiln's JSON-schema matcher (src/infer/structured): testdata/structured/cases.json.

For each schema, texts are generated (random instances of the schema, then random edits of them:
bytes deleted, inserted, duplicated, swapped) and each is labelled by Python's json module and the
jsonschema library (Draft 2020-12), with kiln's stated policy applied to the schema and text:
  - an object with "properties" and no "additionalProperties" takes no other keys;
  - "integer" means an integer literal (1.0 is not one), keys appear at most once;
  - enum / const values are written as their compact JSON text (top-level enums here);
  - no whitespace around the top-level value, at most 16 bytes of whitespace in a row, and only
    the JSON whitespace bytes;
  - strings are well-formed UTF-8 with no control bytes (JSON's rule).
Run (needs jsonschema): python3 tests/reference/make_structured_cases.py
"""
import copy
import json
import os
import random

import jsonschema

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}, "tags": {
        "type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number"}},
    {"type": "object"},
    True,
    {"enum": ["red", "green", 1, 12, None, {"a": [1]}]},
    {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
    {"type": ["boolean", "array"], "items": {"type": "boolean"}},
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
     "required": ["kind"], "additionalProperties": {"type": "integer"}},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                        "required": ["v"]}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"a\"b": {"type": "boolean"}, "\u00e9t\u00e9": {"type": "null"}},
     "required": ["a\"b"]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False, "minItems": 1},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"type": "integer"},
    {"type": "object", "properties": {"x": {"oneOf": [{"type": "object", "properties": {"y": {"type": "string"}}},
                                                       {"type": "array", "items": {"type": "integer"}}]}}},
]

KEYWORDS_POLICY = {"additionalProperties": False}


def policy_schema(s):
    """The schema as kiln enforces it (see the module docstring)."""
    if isinstance(s, list):
        return [policy_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: policy_schema(v) for k, v in s.items()}
    if "properties" in s and "additionalProperties" not in s:
        out["additionalProperties"] = False
    return out


def make_validator(schema):
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda c, x: isinstance(x, int) and not isinstance(x, bool))
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    return cls(policy_schema(schema))


def whitespace_ok(text):
    """No whitespace around the value; runs of at most 16 JSON whitespace bytes outside strings."""
    if not text or text[0] in " \t\n\r" or text[-1] in " \t\n\r":
        return False
    run, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch in " \t\n\r":
            run += 1
            if run > 16:
                return False
        else:
            run = 0
            if ch == '"':
                in_str = True
    return True


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def reject_constant(name):
    raise ValueError(name)


def verdict(schema, data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if not whitespace_ok(text):
        return False
    try:
        value = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return False
    if isinstance(schema, dict) and ("enum" in schema or "const" in schema):
        # enum / const values are matched as their compact JSON text, byte for byte
        values = schema.get("enum", []) + ([schema["const"]] if "const" in schema else [])
        if text not in [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]:
            return False
    return make_validator(schema).is_valid(value)


def ws(rng):
    return rng.choice(["", "", "", " ", "\n  ", "\t"])


def gen(schema, rng, defs, depth=0):
    """A random text of a value of `schema` (JSON text with random whitespace between tokens)."""
    if schema is True or schema == {}:
        schema = rng.choice([{"type": t} for t in ["string", "integer", "number", "boolean", "null"]] +
                            ([{"type": "object"}, {"type": "array"}] if depth < 2 else []))
    if "$defs" in schema:
        defs = schema["$defs"]
    if "$ref" in schema:
        return gen(defs[schema["$ref"].split("/")[-1]], rng, defs, depth + 1)
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False, separators=(",", ":"))
    if "enum" in schema:
        return json.dumps(rng.choice(schema["enum"]), ensure_ascii=False, separators=(",", ":"))
    for k in ("anyOf", "oneOf"):
        if k in schema:
            return gen(rng.choice(schema[k]), rng, defs, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        return gen(dict(schema, type=rng.choice(t)), rng, defs, depth)
    if t == "string":
        lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 8), 8)
        alphabet = ["a", "b", " ", "\u00e9", "\u4e2d", "\U0001F600", "\\n", '\\"', "\\u0041"]
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, max(lo, hi))))
        return '"' + s + '"'
    if t == "integer":
        return str(rng.choice([0, 7, -3, 12345, 10**12]))
    if t == "number":
        return rng.choice(["0", "-1.5", "2e10", "3.25E-2", "42", "-0.0"])
    if t == "boolean":
        return rng.choice(["true", "false"])
    if t == "null":
        return "null"
    if t == "array" or (t is None and ("items" in schema or "prefixItems" in schema)):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems", 4 if depth < 3 else 1)
        if items is False:
            hi = min(hi, len(prefix))
        n = rng.randint(lo, max(lo, min(hi, 4)))
        parts = [gen(prefix[i] if i < len(prefix) else items, rng, defs, depth + 1) for i in range(n)]
        return "[" + ws(rng) + ("," + ws(rng)).join(parts) + ws(rng) + "]"
    if t == "object" or t is None:
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True if not props else False)
        keys = [k for k in props if k in schema.get("required", []) or rng.random() < 0.6]
        rng.shuffle(keys)
        parts = [json.dumps(k, ensure_ascii=False) + ws(rng) + ":" + ws(rng) + gen(props[k], rng, defs, depth + 1)
                 for k in keys]
        if extra is not False and depth < 3 and rng.random() < 0.5:
            parts.append('"extra"' + ":" + gen(extra if isinstance(extra, dict) else True, rng, defs, depth + 1))
        return "{" + ws(rng) + ("," + ws(rng)).join(parts) + ws(rng) + "}"
    raise ValueError(schema)


def mutate(data, rng):
    b = bytearray(data)
    op = rng.randrange(5)
    i = rng.randrange(len(b) + 1)
    if op == 0 and b:
        del b[min(i, len(b) - 1)]
    elif op == 1:
        b[i:i] = rng.choice([b'"', b",", b"}", b"]", b"{", b"[", b":", b"1", b".", b"e", b"-", b" ", b"\\",
                             b"\x01", b"\xc3", b"\xa9", b"n", b"\n" * 17, b"x"])
    elif op == 2 and b:
        j = rng.randrange(len(b) + 1)
        b[j:j] = b[min(i, j):max(i, j)]
    elif op == 3 and len(b) > 1:
        j = rng.randrange(len(b))
        k = min(i, len(b) - 1)
        b[j], b[k] = b[k], b[j]
    else:
        b = b[:i]
    return bytes(b)


def main():
    rng = random.Random(1234)
    cases = []
    for idx, schema in enumerate(SCHEMAS):
        texts = set()
        for _ in range(40):
            t = gen(schema, rng, {}).encode("utf-8")
            texts.add(t)
            for _ in range(4):
                texts.add(mutate(t, rng))
        items = []
        for t in sorted(texts):
            items.append({"hex": t.hex(), "valid": verdict(schema, t)})
        cases.append({"schema": schema, "texts": items})
        print(idx, sum(x["valid"] for x in items), "valid of", len(items))
    out = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "structured", "cases.json")
    with open(out, "w") as f:
        json.dump({"generator": "tests/reference/make_structured_cases.py (json + jsonschema "
                                "Draft 2020-12 with kiln's policy)", "cases": cases}, f, indent=0)


if __name__ == "__main__":
    main()
