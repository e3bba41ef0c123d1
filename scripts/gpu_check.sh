#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool) over a build made on the CPU machine with
#   scripts/build_for_gpu.sh            (static OpenBLAS, sm_90a, carried as .carry/gpu-build.tar.xz)
# It runs the GPU-labelled tests (CUDA against CPU on random inputs, golden bf16 models), the CPU
# suite, and the benchmarks beside the PyTorch reference (.carry/hf_bench.py) in the same call.
# Writes logs under $OUT. Usage: bash scripts/gpu_check.sh [tests|bench|attention|engine|decode|decode-kernel|ab|rules|flags|train|profile|profile-decode|all]
#   attention: the attention GPU tests and bench_attention per prefill variant (D 64 and 128,
#           16-row pages and one contiguous page), a table of ms and TFLOP/s per case.
#   decode: the decode path's GPU tests, bench_decode_step (a step with and without programmatic
#           launch; DECODE_STEP_ARGS="--page-size 128 --engine-bound --greedy" runs it as the engine's greedy graph),
#           with DECODE_ENGINE=1 bench_engine's single-request and B <= 8 decode with KILN_PDL=1 and
#           =0, on the astrai-1b and llama-1b shapes.
#   decode-kernel: the decode-step kernel (KILN_DECODE_STEP_KERNEL=1, an experiment) against the layered
#           step of the same build: the persistent-chain probe beside bench_gemv_floor's chain, the
#           kernel's GPU tests (a hang skips the rest), bench_decode_step at one row (astrai-1b 1K / 8K /
#           30K, llama-1b 1K) with the switch 0 and 1 alternated twice, the kernel's timeline, and
#           bench_engine's single-request decode with each.
#   profile-decode: Nsight Compute per-kernel time and DRAM bandwidth of decode steps of PROFILE_BATCH
#           requests (default 1).
#   profile-prefill: Nsight Compute per-kernel time of single-request prefills (8K, 30K).
#   profile-stalls: where one kernel's warps wait, by SASS instruction (Nsight Compute's warp-state
#           samples, scripts/ncu_stalls.py): one launch of STALL_KERNEL (a regex, default attn_decode)
#           in STALL_CMD (default bench_attention's decode of STALL_BATCH (32) requests of 1K keys,
#           24 / 4 heads of 64); the source page as CSV and the report's details in $OUT.
#   peers: llama.cpp (bench/peers/llama_cpp.sh model + bench) beside kiln's bench_engine single-request runs.
#   engine: the engine, sampler and attention GPU tests, then bench_engine (decode B sweep, online run,
#           shared-prefix TTFT, single-request latency) beside hf_bench.py's batched decode
#           (ENGINE_COMPARE_ARGS: a second bench_engine run with those arguments, e.g. --no-lookahead).
#   train: the training fixtures (tests/reference/make_train_fixtures.py), the training GPU tests,
#          kiln train on CUDA with the result loaded by transformers, and the training benchmarks
#          beside hf_bench.py's training figure.
#   train-bench: bench_train on the llama-1b shape at 8 x 2048 and 8 x 8192, with and without
#          --recompute, beside hf_bench.py's training figure, and bench/bench_preprocess.py (kiln
#          preprocess against tokenizers / transformers on this machine's cores).
#   serve: the engine GPU tests, kiln serve --device cuda on testdata/tiny-tools (greedy replies of the
#          known bf16 model through the OpenAI and Anthropic routes, tool calls), the CPU serve
#          tests that need no pip packages (weight updates, disconnects, 429, SIGTERM, 1,000 streams),
#          and bench_serve on the astrai-1b shape (the online workload direct on the engine and
#          through HTTP in one run).
#   eval: the eval references (tests/reference/make_eval_reference.py -> $OUT/eval_reference.json),
#          kiln eval on CUDA against them (tiny-chat, bf16), the engine GPU tests, and
#          bench/bench_eval.py (kiln eval --task choice on the llama-1b shape beside transformers).
#   distributed: the collectives GPU tests (NCCL over one rank against no collectives, two ranks
#          sharing the GPU under mpirun with sharded master weights), the CPU data-parallel tests
#          under mpirun, and bench_train on the llama-1b shape (8 x 2048) without collectives and
#          through NCCL over one rank at --zero 0, 1 and 2 (the collectives' cost and memory), and
#          bench_rl's sync GRPO loop with the engine in the trainer's process and in a second
#          process sharing the GPU (mpirun -np 2; weights sent as MPI messages at every update:
#          NCCL cannot connect a GPU to itself).
#   ab: a change against its reference in one call: bench_decode_step of this build and of REF_BUILD
#          (default build-ref, unpacked from .carry/gpu-ref.tar.xz, which scripts/build_ref_for_gpu.sh
#          makes from a revision) alternated AB_REPEATS times (2) on AB_SHAPES (astrai-1b) at
#          AB_BATCHES (1,8,32,128) and AB_CONTEXTS (1024); with AB_ENGINE=1 also bench_engine's decode
#          sweep and single-request latencies of each (AB_ENGINE_ARGS: its arguments instead of
#          --skip online,prefix).
#   rules: the same comparison between streaming-kernel rules of this build instead of two builds:
#          each of RULES (space-separated KILN_LINEAR_TMA values, linear_tma.cu; `default` for the
#          measured rule), after the streaming kernel's GPU test and bench_linear --splits
#          at TMA_ROWS (32,64,96,128).
#   flags: bench_engine under each of FLAG_SETS (argument sets separated by ';', e.g.
#          "--page-size 16;--page-size 64"), alternated FLAG_REPEATS (2) times on FLAG_SHAPES
#          (astrai-1b): decode at FLAG_BATCHES (32,128), single requests at FLAG_CONTEXTS (8192,30000).
#   rl: the RL-related GPU tests (sampler behaviour log-probabilities, the cross-entropy options),
#          kiln demo --device cuda, and bench_rl on the llama-1b shape (update latency, a sync GRPO
#          loop's time split).
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
if ldd "$BUILD/bin/kiln" | grep "not found"; then echo "missing shared libraries"; exit 1; fi
status=0
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  # The log is written whole first (a reader that stops early must not cut the run short).
  "$BUILD/tests/kiln_gpu_tests" > "$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |FAILED|error|Failure|rel|teacher-forced" "$OUT/gpu_tests.log" | head -60
  "$BUILD/tests/kiln_tests" > "$OUT/cpu_tests.log" 2>&1 || status=1
  tail -3 "$OUT/cpu_tests.log"
  "$BUILD/bin/kiln" generate --model testdata/tiny-llama --device cuda --max-tokens 8 || status=1
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  CFG=bench/configs/astrai-1b-shape.config.json
  "$BUILD/bin/bench_attention" > "$OUT/bench_attention.json" 2>&1
  grep -E "best_valid" "$OUT/bench_attention.json" | tail -1
  "$BUILD/bin/bench_attention" --head-dim 128 --hq 32 --hkv 8 --decode 1024 --prefill 1024 8192 --chunked 2048 8192 \
    > "$OUT/bench_attention_d128.json" 2>&1; grep -E "best_valid" "$OUT/bench_attention_d128.json" | tail -1
  "$BUILD/bin/bench_ops" --config $CFG --tokens 8192 --context 30000 > "$OUT/bench_ops_prefill.json" 2>&1
  "$BUILD/bin/bench_ops" --config $CFG --tokens 1 --context 1024 > "$OUT/bench_ops_decode.json" 2>&1
  grep -E '"(layer_us|model_ms_excluding_embedding_and_head)"' "$OUT"/bench_ops_*.json
  "$BUILD/bin/bench_engine" --config $CFG --skip decode,online,prefix --single-contexts 1024,8192,30000 \
    > "$OUT/bench_engine_single.json" 2> "$OUT/bench_engine_single.err" || status=1
  cat "$OUT/bench_engine_single.json"
  if [ -f .carry/hf_bench.py ]; then
    PYTHONUNBUFFERED=1 python3 .carry/hf_bench.py --config $CFG --contexts 1024,8192,30000 --skip train \
      --out "$OUT/hf_bench.json" > "$OUT/hf_bench.log" 2>&1 || status=1
    cat "$OUT/hf_bench.json"
  fi
fi
if [ "$WHAT" = attention ]; then
  # Prefill attention: the attention GPU tests (every variant against the CPU twin), then
  # bench_attention per variant (causal bf16, paged 16-row pages and one contiguous page).
  timeout ${ATTN_TEST_TIMEOUT:-300} "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${ATTN_FILTER:-*Attention*}" \
    > "$OUT/gpu_attention_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|Which|error" "$OUT/gpu_attention_tests.log" | head -40
  for ps in ${ATTN_PAGE_SIZES:-16 0}; do
    "$BUILD/bin/bench_attention" --page-size $ps --decode 1024 --prefill ${ATTN_D64_LENS:-1024 8192 16384 30000} \
      --chunked 8192 30000 > "$OUT/attn_d64_p$ps.json" 2>&1 || status=1
    "$BUILD/bin/bench_attention" --page-size $ps --head-dim 128 --hq 32 --hkv 8 --decode 1024 \
      --prefill ${ATTN_D128_LENS:-1024 8192 16384} --chunked 2048 8192 > "$OUT/attn_d128_p$ps.json" 2>&1 || status=1
  done
  python3 - "$OUT"/attn_d*_p*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        r = json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e); continue
    print(f.split("/")[-1], "D", r["head_dim"], "page", r["page_size"])
    for c in r["prefill"]:
        cells = ["v%d %.3f ms %.0f TF%s" % (x["variant"], x["ms"], x["tflop_per_s"], "" if x["valid"] else " INVALID(%.2g)" % x["rel_l2_err"]) for x in c["results"]]
        print("  %5d/%5d (default v%d): %s" % (c["q_len"], c["kv_len"], c["default_variant"], " | ".join(cells)))
PY
fi
if [ "$WHAT" = engine ]; then
  CFG=bench/configs/astrai-1b-shape.config.json
  timeout ${ENGINE_TEST_TIMEOUT:-300} "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${ENGINE_FILTER:-*Engine*:*Sampl*:*Attention*:*Golden*:*Qkv*}" \
    > "$OUT/gpu_engine_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|Which|error" "$OUT/gpu_engine_tests.log" | head -50
  timeout ${ENGINE_BENCH_TIMEOUT:-300} "$BUILD/bin/bench_engine" --config $CFG ${ENGINE_BENCH_ARGS:-} > "$OUT/bench_engine.json" \
    2> "$OUT/bench_engine.err" || { status=1; tail -5 "$OUT/bench_engine.err"; }
  cat "$OUT/bench_engine.json"
  # A second run in the same call, the reference of a change (ENGINE_COMPARE_ARGS, e.g.
  # "--skip single,online,prefix --no-lookahead").
  if [ -n "${ENGINE_COMPARE_ARGS:-}" ]; then
    timeout ${ENGINE_BENCH_TIMEOUT:-300} "$BUILD/bin/bench_engine" --config $CFG $ENGINE_COMPARE_ARGS \
      > "$OUT/bench_engine_compare.json" 2>> "$OUT/bench_engine.err" || { status=1; tail -5 "$OUT/bench_engine.err"; }
    cat "$OUT/bench_engine_compare.json"
  fi
  # Decode projections: cuBLASLt, the fused small-batch kernel and the TMA kernel at each row count
  # given (LINEAR_ROWS, e.g. "1,8,32,128"; LINEAR_SPLITS=1 adds the TMA kernel's K-split sweep).
  if [ -n "${LINEAR_ROWS:-}" ]; then
    timeout ${LINEAR_TIMEOUT:-150} "$BUILD/bin/bench_linear" --config $CFG --rows "$LINEAR_ROWS" ${LINEAR_SPLITS:+--splits} > "$OUT/bench_linear.json" \
      2> "$OUT/bench_linear.err" || { status=1; tail -5 "$OUT/bench_linear.err"; }
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
for m, ops in r["rows"].items(): print("rows", m, {k: round(v["us"], 2) for k, v in ops.items()})' "$OUT/bench_linear.json"
    # A plain one-row GEMV of the astrai-1b projections beside them (what a launch per projection reaches).
    [ -x "$BUILD/bin/bench_gemv_floor" ] && { timeout 60 "$BUILD/bin/bench_gemv_floor" || status=1; }
    # The same projections in one persistent kernel streaming across their dependencies (the probe).
    [ -x "$BUILD/bin/bench_persistent_chain" ] && { timeout 90 "$BUILD/bin/bench_persistent_chain" || status=1; }
  fi
  # The page size, chosen by measurement: batched decode at each candidate size (one file).
  for ps in ${PAGE_SWEEP:-}; do
    echo "page_size $ps"
    timeout 120 "$BUILD/bin/bench_engine" --config $CFG --skip single,online,prefix --batches 32,128 --page-size $ps \
      2>> "$OUT/bench_engine.err" | tr -d '\n' ; echo
  done > "$OUT/bench_engine_pages.json"
  [ -n "${PAGE_SWEEP:-}" ] && cat "$OUT/bench_engine_pages.json"
  if [ -f .carry/hf_bench.py ] && [ -z "${SKIP_HF:-}" ]; then
    PYTHONUNBUFFERED=1 timeout 240 python3 .carry/hf_bench.py --config $CFG --contexts 1024 --batches 1,8,32,64,128 \
      --skip static,train --out "$OUT/hf_bench.json" > "$OUT/hf_bench.log" 2>&1 || status=1
    cat "$OUT/hf_bench.json"
  fi
fi
if [ "$WHAT" = decode ]; then
  # The decode path's GPU tests, then bench_decode_step (a graph-replayed step with and without
  # programmatic launch) on the astrai-1b and llama-1b shapes, and with DECODE_ENGINE=1
  # bench_engine's single-request and B <= 8 decode with KILN_PDL=1 and =0, in one call.
  timeout ${DECODE_TEST_TIMEOUT:-240} "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${DECODE_FILTER:-*DecodeLayers*:*FusedLinear*:*Attention*Decode*}" \
    > "$OUT/gpu_decode_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|Which|error" "$OUT/gpu_decode_tests.log" | head -40
  for shape in ${DECODE_SHAPES:-astrai-1b llama-1b}; do
    timeout ${DECODE_BENCH_TIMEOUT:-200} "$BUILD/bin/bench_decode_step" --config bench/configs/$shape-shape.config.json \
      --batches ${DECODE_BATCHES:-1,2,4,8} --contexts ${DECODE_CONTEXTS:-1024,8192,30000} ${DECODE_STEP_ARGS:-} \
      > "$OUT/bench_decode_step_$shape.json" 2> "/tmp/bench_decode_step_$shape.err" || { status=1; tail -3 "/tmp/bench_decode_step_$shape.err"; }
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
for x in r["runs"]:
    print(sys.argv[2], "B=%d C=%d" % (x["batch"], x["context"]),
          "%.3f ms (%.2f TB/s), serial launches %.3f ms, floor %.3f" % (x["layers_ms"], x["layers_tb_per_s"],
          x["layers_serial_ms"], x["floor_ms_at_4.3_tb_per_s"]))' "$OUT/bench_decode_step_$shape.json" $shape || status=1
    # The engine around it (DECODE_ENGINE=1): single-request decode and B <= 8, with and without it.
    for pdl in ${DECODE_ENGINE:+1 0}; do
      KILN_PDL=$pdl timeout ${DECODE_BENCH_TIMEOUT:-200} "$BUILD/bin/bench_engine" --config bench/configs/$shape-shape.config.json \
        --skip online,prefix --batches ${DECODE_BATCHES:-1,2,4,8} --single-contexts ${DECODE_CONTEXTS:-1024,8192,30000} \
        2> "/tmp/bench_engine_$shape.pdl$pdl.err" > "$OUT/bench_engine_$shape.pdl$pdl.json" || status=1
      python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], [(x["context"], round(x["decode_ms_per_token"], 3)) for x in r["single"]],
      [(x["batch"], round(x["ms_per_step"], 3)) for x in r["decode"]])' "$OUT/bench_engine_$shape.pdl$pdl.json" "$shape KILN_PDL=$pdl" || status=1
    done
  done
fi
if [ "$WHAT" = decode-kernel ]; then
  timeout 60 "$BUILD/bin/bench_persistent_chain" > "$OUT/persistent_chain.json" 2> "$OUT/persistent_chain.err" || status=1
  head -c 4000 "$OUT/persistent_chain.json"; timeout 60 "$BUILD/bin/bench_gemv_floor" | grep -E '"chain|device'
  timeout 120 "$BUILD/tests/kiln_gpu_tests" --gtest_filter='DecodeStepKernelGpu.*' > "$OUT/gpu_decode_kernel_tests.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$OUT/gpu_decode_kernel_tests.log" | head -30
  on="0 1"; [ $rc -eq 124 ] && on=0 && echo "the kernel's tests hung: its benchmarks are skipped"
  step_ms() {  # shape, contexts: ms per step at one row
    timeout 60 "$BUILD/bin/bench_decode_step" --config bench/configs/$1-shape.config.json --batches 1 --contexts $2 \
      ${3:-} 2>/dev/null | python3 -c 'import json, sys
r = json.load(sys.stdin)
print(" ".join("C=%d %.3f ms" % (x["context"], x["layers_ms"]) for x in r["runs"]))
[print(x["context"], json.dumps(x["decode_step_timeline"])) for x in r["runs"] if "decode_step_timeline" in x]' || echo failed; }
  for rep in 1 2; do for k in $on; do
    echo "KILN_DECODE_STEP_KERNEL=$k astrai-1b $(KILN_DECODE_STEP_KERNEL=$k step_ms astrai-1b 1024,8192,30000)" \
         "llama-1b $(KILN_DECODE_STEP_KERNEL=$k step_ms llama-1b 1024)"
  done; done
  if [ "$on" = "0 1" ]; then
    echo "timeline: $(KILN_DECODE_STEP_KERNEL=1 KILN_DECODE_STEP_TRACE=1 step_ms astrai-1b 1024,30000 '--iters 20')"
    for k in 0 1; do
      KILN_DECODE_STEP_KERNEL=$k timeout 120 "$BUILD/bin/bench_engine" --config bench/configs/astrai-1b-shape.config.json \
        --skip online,prefix --batches 1 --single-contexts 1024,8192,30000 > "$OUT/bench_engine_kernel$k.json" 2>/dev/null || status=1
      python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], [(x["context"], round(x["decode_ms_per_token"], 3)) for x in r["single"]])' \
        "$OUT/bench_engine_kernel$k.json" "engine KILN_DECODE_STEP_KERNEL=$k" || status=1
    done
  fi
fi
if [ "$WHAT" = peers ]; then
  # llama.cpp beside kiln (bench/peers/README.md): its own converter writes a GGUF of a random-weight
  # checkpoint of each shape, llama-bench runs pp and tg at 1K / 8K / 30K; kiln's bench_engine
  # single-request figures in the same call. Carry build-peers/llama-cpp-peer.tar.xz in .carry/.
  for m in ${PEER_SHAPES:-astrai-1b llama-1b}; do
    timeout ${PEER_TIMEOUT:-400} bash bench/peers/llama_cpp.sh model bench/configs/$m-shape.config.json /tmp/peer-$m \
      > /tmp/peer-$m.model.log 2>&1 || { status=1; tail -5 /tmp/peer-$m.model.log; continue; }
    timeout ${PEER_TIMEOUT:-400} bash bench/peers/llama_cpp.sh bench /tmp/peer-$m/model-bf16.gguf "$OUT/llama_cpp_$m.json" \
      || status=1
    timeout 200 "$BUILD/bin/bench_engine" --config bench/configs/$m-shape.config.json --skip decode,online,prefix \
      --single-contexts 1024,8192,30000 2> /tmp/bench_engine_$m.err > "$OUT/bench_engine_single_$m.json" || status=1
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("kiln", sys.argv[2], [(x["context"], round(x["prefill_ms"], 2), round(x["decode_ms_per_token"], 3)) for x in r["single"]])' \
      "$OUT/bench_engine_single_$m.json" $m || status=1
  done
fi
if [ "$WHAT" = train ] || [ "$WHAT" = all ]; then
  # The device tool returns at most 8 files: logs go to $LOGS, the results worth keeping to $OUT.
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  OUT=$OUT python3 tests/reference/make_train_fixtures.py > "$LOGS/train_fixtures.log" 2>&1 || status=1
  tail -2 "$LOGS/train_fixtures.log"
  "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${TRAIN_FILTER:-*Train*:*LossOptim*:*Muon*:*Recompute*:*ResumeGpu*}" > "$OUT/gpu_train_tests.log" 2>&1 \
    || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|rel|error" "$OUT/gpu_train_tests.log" | head -60
  # kiln train on the GPU; transformers must load the result and agree with kiln score on it.
  python3 -c 'import json
for i in range(24):
    s = 3 + (i * 37) % 300; st = 1 + i % 3
    print(json.dumps({"input_ids": [3 + (s + st * t) % 380 for t in range(24)]}))' > "$LOGS/synthetic.jsonl"
  "$BUILD/bin/kiln" train --model testdata/tiny-llama --data "$LOGS/synthetic.jsonl" --output "$LOGS/trained" \
    --device cuda --steps 100 --batch-size 4 --lr 3e-3 --shuffle > "$LOGS/kiln_train.log" 2>&1 || status=1
  sed -n '2p;$p' "$LOGS/kiln_train.log"; tail -1 "$LOGS/kiln_train.log"
  IDS=3,40,41,42,43,44,45,46,47,48,49,50
  { "$BUILD/bin/kiln" score --model "$LOGS/trained" --ids $IDS 2>&1
    python3 tests/reference/check_trained_checkpoint.py "$LOGS/trained" --ids $IDS 2>/dev/null; } > "$OUT/trained_scores.json" \
    || status=1
  cat "$OUT/trained_scores.json"
  "$BUILD/bin/bench_attention_train" > "$OUT/bench_attention_train.json" 2>&1; cat "$OUT/bench_attention_train.json"
  "$BUILD/bin/bench_train" --config bench/configs/llama-1b-shape.config.json --batch 8x2048 \
    > "$OUT/bench_train.json" 2>&1 || status=1
  cat "$OUT/bench_train.json"
  if [ -f .carry/hf_bench.py ] && [ -z "${SKIP_HF:-}" ]; then
    PYTHONUNBUFFERED=1 python3 .carry/hf_bench.py --config bench/configs/llama-1b-shape.config.json --skip static \
      --contexts 1024 --out "$OUT/hf_bench_train.json" > "$LOGS/hf_bench_train.log" 2>&1 || status=1
    cat "$OUT/hf_bench_train.json"
  fi
fi
if [ "$WHAT" = train-bench ]; then
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  CFG=bench/configs/llama-1b-shape.config.json
  for run in "8x2048" "8x2048 --recompute" "8x8192" "8x8192 --recompute"; do
    "$BUILD/bin/bench_train" --config $CFG --batch $run >> "$OUT/bench_train.json" 2> "$LOGS/bench_train.err" || status=1
  done
  cat "$OUT/bench_train.json"
  if [ -f .carry/hf_bench.py ] && [ -z "${SKIP_HF:-}" ]; then
    PYTHONUNBUFFERED=1 python3 .carry/hf_bench.py --config $CFG --skip static \
      --contexts 1024 --out "$OUT/hf_bench_train.json" > "$LOGS/hf_bench_train.log" 2>&1 || status=1
    cat "$OUT/hf_bench_train.json"
  fi
  [ -z "${SKIP_PREPROCESS:-}" ] && { timeout 240 python3 bench/bench_preprocess.py --kiln "$BUILD/bin/kiln" --mb ${PREPROCESS_MB:-60} \
    > "$OUT/bench_preprocess.json" 2> "$LOGS/bench_preprocess.err" || { status=1; tail -5 "$LOGS/bench_preprocess.err"; }
    cat "$OUT/bench_preprocess.json"; }
fi
if [ "$WHAT" = distributed ]; then
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  timeout 400 "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${DIST_FILTER:-*Collectives*:*Resume*:*Muon*:*LossOptim*}" \
    > "$OUT/gpu_distributed_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|Which|error|Skipped" "$OUT/gpu_distributed_tests.log" | head -40
  timeout 300 "$BUILD/tests/kiln_tests" --gtest_filter='DataParallel*:World*' > "$LOGS/cpu_dp_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Skipped" "$LOGS/cpu_dp_tests.log" | head -20
  CFG=bench/configs/llama-1b-shape.config.json
  for run in "--collectives none" "--collectives nccl --zero 0" "--collectives nccl --zero 1" "--collectives nccl --zero 2" \
             "--collectives none"; do
    timeout 200 "$BUILD/bin/bench_train" --config $CFG --batch 8x2048 $run >> "$OUT/bench_train_collectives.json" \
      2>> "$LOGS/bench_train.err" || { status=1; tail -3 "$LOGS/bench_train.err"; }
  done
  python3 - "$OUT/bench_train_collectives.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
dec, i = json.JSONDecoder(), 0
while i < len(text):
    while i < len(text) and text[i].isspace(): i += 1
    if i >= len(text): break
    r, i = dec.raw_decode(text, i)
    t = r["train"]
    print(t["collectives"], "zero", t["zero"], "ms/step %.1f" % t.get("ms_per_step", -1), "tok/s %.0f" % t.get("tok_s", -1),
          "peak GB %.2f" % t["peak_mem_gb"], "resident GB %.2f" % (t["resident_bytes_before_steps"] / 1e9), t.get("phases_ms", t.get("error")))
PY
  RL_ARGS="--config $CFG --device cuda:0 --steps 4 --group-size 8 --prompts-per-step 8 --prompt-len 256 --max-tokens 128"
  timeout 300 "$BUILD/bin/bench_rl" $RL_ARGS --work /tmp/kiln-rl-local > "$OUT/bench_rl_local.json" 2> "$LOGS/bench_rl_local.err" \
    || { status=1; tail -3 "$LOGS/bench_rl_local.err"; }
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --oversubscribe -np 2 \
    "$BUILD/bin/bench_rl" $RL_ARGS --remote --work /tmp/kiln-rl-remote > "$OUT/bench_rl_remote.json" 2> "$LOGS/bench_rl_remote.err" \
    || { status=1; tail -3 "$LOGS/bench_rl_remote.err"; }
  grep "weights over" "$LOGS/bench_rl_remote.err"
  python3 - "$OUT/bench_rl_local.json" "$OUT/bench_rl_remote.json" <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        r = json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e); continue
    g = r["grpo"]
    print("engine", "remote" if r["remote_engine"] else "in-process", {k: round(v, 4) if isinstance(v, float) else v for k, v in g.items()},
          r.get("update", ""))
PY
fi
if [ "$WHAT" = serve ]; then
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  timeout 300 "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${SERVE_FILTER:-*Engine*:*Sampl*}" > "$OUT/gpu_serve_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|actual|Which|error" "$OUT/gpu_serve_tests.log" | head -30
  KILN="$BUILD/bin/kiln" KILN_SERVE_DEVICE=cuda timeout 300 python3 -m unittest tests/serve/test_serve_gpu.py > "$OUT/serve_gpu.log" 2>&1 || status=1
  tail -4 "$OUT/serve_gpu.log"
  KILN="$BUILD/bin/kiln" timeout 300 python3 -m unittest tests/serve/test_serve_ops.py > "$LOGS/serve_ops.log" 2>&1 || status=1
  tail -3 "$LOGS/serve_ops.log"
  timeout 500 "$BUILD/bin/bench_serve" --config bench/configs/astrai-1b-shape.config.json --device cuda \
    ${SERVE_BENCH_ARGS:-} > "$OUT/bench_serve.json" 2> "$LOGS/bench_serve.err" || { status=1; tail -5 "$LOGS/bench_serve.err"; }
  cat "$OUT/bench_serve.json"
fi
if [ "$WHAT" = eval ]; then
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  python3 tests/reference/make_eval_reference.py "$OUT/eval_reference.json" > "$LOGS/eval_ref.log" 2>&1 \
    || { status=1; tail -20 "$LOGS/eval_ref.log"; }
  for task in choice perplexity; do
    "$BUILD/bin/kiln" eval --task $task --model testdata/tiny-chat --device cuda --data testdata/eval/$task.jsonl \
      --details "$LOGS/cuda_$task.jsonl" > "$LOGS/cuda_$task.json" 2> "$LOGS/cuda_$task.err" || { status=1; tail -3 "$LOGS/cuda_$task.err"; }
  done
  python3 - "$OUT/eval_reference.json" "$LOGS" <<'PY' | tee "$OUT/eval_cuda_vs_reference.txt"
import json, sys
ref = json.load(open(sys.argv[1]))["models"]["tiny-chat"]
got = [json.loads(l) for l in open(sys.argv[2] + "/cuda_choice.jsonl")]
worst = max(abs(a - b) / max(1.0, abs(b)) for g, r in zip(got, ref["choice"]["questions"])
            for a, b in zip(g["loglikelihoods"], r["loglikelihoods"]))
print("cuda bf16 choice: worst log-likelihood error %.3g relative (reference fp32 transformers)" % worst)
ppl = json.load(open(sys.argv[2] + "/cuda_perplexity.json"))["results"]["perplexity"]
print("cuda bf16 perplexity %.6g against %.6g" % (ppl, ref["perplexity"][0]["perplexity"]))
PY
  timeout 200 "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${EVAL_FILTER:-*Engine*:*Golden*:*CrossEntropy*}" \
    > "$OUT/gpu_eval_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$OUT/gpu_eval_tests.log" | head -20
  timeout 400 python3 bench/bench_eval.py --kiln "$BUILD/bin/kiln" > "$OUT/bench_eval.json" 2> "$LOGS/bench_eval.err" \
    || { status=1; tail -10 "$LOGS/bench_eval.err"; }
  cat "$OUT/bench_eval.json"
fi
if [ "$WHAT" = rl ]; then
  LOGS=${LOGS:-/tmp/kiln-logs}; mkdir -p "$LOGS"
  timeout 300 "$BUILD/tests/kiln_gpu_tests" --gtest_filter="${RL_FILTER:-*Sampl*:*CrossEntropy*:*LossOptim*}" \
    > "$OUT/gpu_rl_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$OUT/gpu_rl_tests.log" | head -30
  timeout 300 "$BUILD/bin/kiln" demo --device cuda --output "$LOGS/demo" > "$OUT/demo_cuda.log" 2>&1 || status=1
  grep -E "after SFT|after GRPO|attribution|error" "$OUT/demo_cuda.log"
  timeout 400 "$BUILD/bin/bench_rl" --config bench/configs/llama-1b-shape.config.json ${RL_BENCH_ARGS:-} \
    > "$OUT/bench_rl.json" 2> "$LOGS/bench_rl.err" || { status=1; tail -5 "$LOGS/bench_rl.err"; }
  cat "$OUT/bench_rl.json"
fi
if [ "$WHAT" = ab ] || [ "$WHAT" = rules ]; then
  # Each variant is a build (ab) or a KILN_LINEAR_TMA rule of this build (rules).
  if [ "$WHAT" = ab ]; then
    REF=${REF_BUILD:-build-ref}
    [ -f .carry/gpu-ref.tar.xz ] && tar -xJf .carry/gpu-ref.tar.xz
    [ -x "$REF/bin/bench_decode_step" ] || { echo "no reference build in $REF (scripts/build_ref_for_gpu.sh REV)"; exit 1; }
    VARIANTS="$BUILD $REF"
  else
    VARIANTS=${RULES:?RULES: the KILN_LINEAR_TMA values to compare}
    timeout 300 "$BUILD/tests/kiln_gpu_tests" --gtest_filter='CudaFusedKernels.StreamingLinear*' > "$OUT/tma_tests.log" 2>&1 \
      || { status=1; grep -E "Failure|FAILED" "$OUT/tma_tests.log" | head -20; }
    tail -1 "$OUT/tma_tests.log"
    timeout 200 "$BUILD/bin/bench_linear" --config bench/configs/astrai-1b-shape.config.json --rows ${TMA_ROWS:-32,64,96,128} \
      --splits > "$OUT/bench_linear.json" 2> /tmp/bench_linear.err \
      || { status=1; tail -3 /tmp/bench_linear.err; }
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
for rows, e in r["rows"].items():
    for p in ("qkv", "o", "gate_up", "down"):
        best = sorted((v["us"], k) for k, v in e.items() if k.startswith(p + "_"))
        print(rows, p, " ".join("%s %.2f" % (k, us) for us, k in best[:10]))' "$OUT/bench_linear.json" || status=1
  fi
  # bench VARIANT PROGRAM ARGS...: the program of the variant's build in its environment, under timeout.
  bench() {
    local v=$1 prog=$2; shift 2
    if [ "$WHAT" = ab ]; then timeout ${AB_TIMEOUT:-200} "$v/bin/$prog" "$@"
    elif [ "$v" = default ]; then env -u KILN_LINEAR_TMA timeout ${AB_TIMEOUT:-200} "$BUILD/bin/$prog" "$@"
    else env KILN_LINEAR_TMA="$v" timeout ${AB_TIMEOUT:-200} "$BUILD/bin/$prog" "$@"; fi
  }
  for shape in ${AB_SHAPES:-astrai-1b}; do
    for rep in $(seq ${AB_REPEATS:-2}); do
      for v in $VARIANTS; do
        bench "$v" bench_decode_step --config bench/configs/$shape-shape.config.json \
          --batches ${AB_BATCHES:-1,8,32,128} --contexts ${AB_CONTEXTS:-1024} > "$OUT/ab_$shape.json" 2> /tmp/ab.err \
          || { status=1; tail -3 /tmp/ab.err; continue; }
        python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], " ".join("B=%d C=%d %.3f (serial %.3f)" % (x["batch"], x["context"], x["layers_ms"],
      x["layers_serial_ms"]) for x in r["runs"]))' "$OUT/ab_$shape.json" "$shape $v" || status=1
      done
    done
  done
  for v in ${AB_ENGINE:+$VARIANTS}; do
    bench "$v" bench_engine --config bench/configs/astrai-1b-shape.config.json \
      ${AB_ENGINE_ARGS:---skip online,prefix} > "$OUT/ab_engine.json" 2> /tmp/ab.err || { status=1; tail -3 /tmp/ab.err; continue; }
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], "decode tok/s", [(x["batch"], round(x["tokens_per_s"])) for x in r.get("decode", [])],
      "full-bucket graph ms", [(x["batch"], round(x.get("full_bucket_graph_ms", 0), 3)) for x in r.get("decode", [])],
      "single ms/token", [(x["context"], round(x["decode_ms_per_token"], 3)) for x in r.get("single", [])])' \
      "$OUT/ab_engine.json" "engine $v" || status=1
  done
fi
if [ "$WHAT" = flags ]; then
  # The engine under each of FLAG_SETS (bench_engine argument sets separated by ';', e.g.
  # "--page-size 16;--page-size 32;--page-size 64"), alternated FLAG_REPEATS times on each shape.
  IFS=';' read -r -a sets <<< "${FLAG_SETS:?FLAG_SETS: bench_engine argument sets separated by ;}"
  for shape in ${FLAG_SHAPES:-astrai-1b}; do
    for rep in $(seq ${FLAG_REPEATS:-2}); do
      for args in "${sets[@]}"; do
        # $args unquoted: one set's words are separate arguments.
        timeout ${FLAG_TIMEOUT:-200} "$BUILD/bin/bench_engine" --config bench/configs/$shape-shape.config.json \
          --skip online,prefix --batches ${FLAG_BATCHES:-32,128} --single-contexts ${FLAG_CONTEXTS:-8192,30000} $args \
          > "$OUT/flags_$shape.json" 2> /tmp/flags.err || { status=1; tail -3 /tmp/flags.err; continue; }
        python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], "| decode tok/s", [(x["batch"], round(x["tokens_per_s"])) for x in r.get("decode", [])],
      "full-bucket graph ms", [(x["batch"], round(x.get("full_bucket_graph_ms", 0), 3)) for x in r.get("decode", [])],
      "| prefill ms", [(x["context"], round(x["prefill_ms"], 2)) for x in r.get("single", [])],
      "decode ms/token", [(x["context"], round(x["decode_ms_per_token"], 3)) for x in r.get("single", [])])' \
          "$OUT/flags_$shape.json" "$shape $args" || status=1
      done
    done
  done
fi
if [ "$WHAT" = profile ]; then
  # Per-kernel times of training steps (Nsight Compute, durations only; first-choice GEMM algorithms).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  KILN_GEMM_AUTOTUNE=0 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    "$BUILD/bin/bench_train" --config bench/configs/llama-1b-shape.config.json --batch 8x2048 --steps 1 --warmup 1 \
    > /tmp/ncu.csv 2> /tmp/ncu.err || { tail -5 /tmp/ncu.err; status=1; }
  python3 scripts/ncu_summary.py /tmp/ncu.csv --steps 3 --top 30 | tee "$OUT/ncu_summary.txt"
fi
if [ "$WHAT" = profile-engine ]; then
  # Per-kernel times of batched decode steps (Nsight Compute, eager steps so every kernel is seen):
  # PROFILE_BATCH requests of a 1K prompt; the window skips warm-up and prefill.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  B=${PROFILE_BATCH:-128}
  "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip ${PROFILE_SKIP:-6000} \
    --launch-count ${PROFILE_COUNT:-1200} "$BUILD/bin/bench_engine" --config bench/configs/astrai-1b-shape.config.json \
    --skip single,online,prefix --batches $B --decode-tokens 60 --no-graphs > /tmp/ncu_engine.csv 2> /tmp/ncu_engine.err \
    || { tail -5 /tmp/ncu_engine.err; status=1; }
  python3 scripts/ncu_summary.py /tmp/ncu_engine.csv --steps ${PROFILE_STEPS:-5} --top 30 | tee "$OUT/ncu_engine_B$B.txt"
fi
if [ "$WHAT" = profile-prefill ]; then
  # Per-kernel time of single-request prefills (Nsight Compute, durations only, eager steps): the
  # astrai-1b shape at each of PROFILE_CONTEXTS (two runs each, the first warms up; per prefill).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for n in ${PROFILE_CONTEXTS:-8192 30000}; do
    "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv "$BUILD/bin/bench_engine" \
      --config bench/configs/astrai-1b-shape.config.json --skip decode,online,prefix --single-contexts $n \
      --decode-tokens 2 --no-graphs > /tmp/ncu_prefill_$n.csv 2> /tmp/ncu_prefill_$n.err || { tail -5 /tmp/ncu_prefill_$n.err; status=1; }
    python3 scripts/ncu_summary.py /tmp/ncu_prefill_$n.csv --steps 2 --top 25 | tee "$OUT/ncu_prefill_$n.txt"
  done
fi
if [ "$WHAT" = profile-stalls ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  CMD=${STALL_CMD:-"$BUILD/bin/bench_attention --hq 24 --hkv 4 --head-dim 64 --page-size 128 --decode-batch ${STALL_BATCH:-32} --decode 1024 --prefill 0 --chunked 0"}
  # shellcheck disable=SC2086
  "$NCU" --clock-control none --set full --import-source no -k "regex:${STALL_KERNEL:-attn_decode}" --launch-skip 20 \
    --launch-count 1 -f -o /tmp/stalls $CMD > /tmp/stalls.log 2>&1 || { tail -5 /tmp/stalls.log; status=1; }
  "$NCU" -i /tmp/stalls.ncu-rep --page source --csv --print-source sass > "$OUT/stalls_sass.csv" 2>&1
  "$NCU" -i /tmp/stalls.ncu-rep --page details > "$OUT/stalls_details.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Eligible Warps|Active Warps Per" "$OUT/stalls_details.txt" | head -6
  python3 scripts/ncu_stalls.py "$OUT/stalls_sass.csv" --top 25 | tee "$OUT/stalls.txt"
fi
if [ "$WHAT" = profile-decode ]; then
  # Per-kernel time and DRAM bandwidth of decode steps of PROFILE_BATCH requests (Nsight Compute, eager steps, each
  # kernel replayed alone: no overlap between kernels), on each of PROFILE_SHAPES.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for shape in ${PROFILE_SHAPES:-astrai-1b}; do
    "$NCU" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
      --launch-skip ${PROFILE_SKIP:-4000} --launch-count ${PROFILE_COUNT:-700} "$BUILD/bin/bench_engine" \
      --config bench/configs/$shape-shape.config.json --skip single,online,prefix --batches ${PROFILE_BATCH:-1} --decode-tokens 64 \
      --no-graphs > /tmp/ncu_decode.csv 2> /tmp/ncu_decode.err || { tail -5 /tmp/ncu_decode.err; status=1; }
    python3 scripts/ncu_summary.py /tmp/ncu_decode.csv --steps ${PROFILE_STEPS:-4} --top 30 \
      | tee "$OUT/ncu_decode_${shape}_b${PROFILE_BATCH:-1}.txt"
  done
fi
exit $status
