#!/usr/bin/env bash
# One GPU call for kernel work: more fixtures from transformers, all GPU tests, every prefill
# attention variant, and the model benchmark with the old and new default variants.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-out}; mkdir -p "$OUT"
tar -xJf .carry/gpu-build.tar.xz
export KILN_TESTDATA=$PWD/testdata KILN_BINARY=$PWD/build-gpu/bin/kiln
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
(cd /tmp && OUT=$OUT PYTHONUNBUFFERED=1 timeout 120 python3 $OLDPWD/tests/reference/make_model_fixtures.py > $OUT/fixtures.log 2>&1; tail -5 $OUT/fixtures.log)
build-gpu/tests/kiln_gpu_tests --gtest_filter="DebugTmp*" 2>&1 | grep -E "tiny|OK|FAIL"; build-gpu/tests/kiln_gpu_tests > $OUT/gpu_tests.log 2>&1; grep -E "FAILED|PASSED" $OUT/gpu_tests.log | head -30
timeout 150 build-gpu/bin/bench_attention > $OUT/bench_attention.json 2>&1; grep -E "best|variant\": [0-9], \"ms" $OUT/bench_attention.json | cut -c1-80 | tail -30
timeout 100 build-gpu/bin/bench_attention --head-dim 128 --hq 32 --hkv 8 --decode 1024 --prefill 1024 8192 --chunked 2048 8192 > $OUT/bench_attention_d128.json 2>&1; grep -E "best" $OUT/bench_attention_d128.json
build-gpu/bin/bench_ops --config bench/configs/astrai-1b-shape.config.json --tokens 8192 --context 30000 > $OUT/bench_ops.json 2>&1; cat $OUT/bench_ops.json
for v in ${VARIANTS:-1}; do
  KILN_ATTN_PREFILL_VARIANT=$v timeout 100 build-gpu/bin/bench_engine --config bench/configs/astrai-1b-shape.config.json \
    --skip decode,online,prefix --single-contexts 1024,8192,30000 --decode-tokens 32 > $OUT/bench_engine_v$v.json 2>&1
  echo "variant $v"; grep -A3 -E '"context"' $OUT/bench_engine_v$v.json
done
