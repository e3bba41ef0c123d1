#!/usr/bin/env bash
# Builds and runs the tokenizer fuzz target (libFuzzer + AddressSanitizer, clang) against the
# tokenizer sources directly; not part of the CMake build (CI uses g++).
# Usage: scripts/fuzz.sh [SECONDS=60] [extra libFuzzer flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"; shift || true
out=build-fuzz
mkdir -p "$out/corpus"
CXX="${CXX:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++
"$CXX" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -DPCRE2_CODE_UNIT_WIDTH=8 -DKILN_TESTDATA="\"$PWD/testdata\"" -Isrc \
  fuzz/tokenizer_fuzz.cpp src/model/tokenizer/*.cpp -lpcre2-8 -lutf8proc -o "$out/tokenizer_fuzz"
# Seed corpus: the golden texts.
python3 - "$out/corpus" <<'PY'
import json, sys, os
for i, c in enumerate(json.load(open("testdata/tokenizers/golden.json"))["cases"]):
    open(os.path.join(sys.argv[1], f"golden{i}"), "w", encoding="utf-8").write(c["text"])
PY
"$out/tokenizer_fuzz" -max_total_time="$secs" -max_len=512 -print_final_stats=1 "$@" "$out/corpus"
